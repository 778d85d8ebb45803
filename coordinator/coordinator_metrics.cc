#include "coordinator/coordinator_metrics.h"

#include <algorithm>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace longhaul::coordinator {
namespace {

constexpr v1::JobState kJobStates[] = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,   v1::JOB_STATE_RECOVERING,
                                       v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED};
constexpr v1::WorkerState kWorkerStates[] = {v1::WORKER_STATE_IDLE, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_DEAD};

std::string Lower(const char* s) { return absl::AsciiStrToLower(s); }

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& r, CoordinatorService* service)
    : service_(service),
      job_info_(Gauge(r, "longhaul_job_info", "Always 1; labels job_id and name (join on job_id for the name)")),
      job_step_(Gauge(r, "longhaul_job_step", "Steps the job has completed (as reported by its last stage)")),
      job_loss_(Gauge(r, "longhaul_job_loss", "Training loss of the job's last completed step")),
      job_tokens_(Gauge(r, "longhaul_job_tokens_per_second",
                        "Training throughput: tokens per second since the first step (start-up excluded)")),
      job_state_(Gauge(r, "longhaul_job_state", "1 for the job's current state (label state), 0 for the others")),
      job_restarts_(prometheus::BuildCounter()
                        .Name("longhaul_job_restarts_total")
                        .Help("Times the job was restarted after a failure (docs/recovery.md)")
                        .Register(r)),
      stage_straggler_(Gauge(r, "longhaul_job_stage_straggler",
                             "1 when the stage computes more than recovery.straggler_factor times its prediction per "
                             "step (docs/recovery.md), else 0")),
      stage_compute_(Gauge(r, "longhaul_job_stage_compute_seconds",
                           "The stage's compute per step: its step time less its waits on links (median of recent "
                           "steps; 0 until measured)")),
      stage_predicted_(Gauge(r, "longhaul_job_stage_predicted_compute_seconds",
                             "The stage's predicted compute per step (its worker's measured speed, else the other "
                             "stages'; 0: none)")),
      worker_heartbeat_age_(Gauge(r, "longhaul_worker_heartbeat_age_seconds",
                                  "Seconds since the worker's last message (live workers only; a dead "
                                  "worker's series are removed)")),
      worker_state_(Gauge(r, "longhaul_worker_state", "1 for the worker's current state (label state), 0 for the others")),
      workers_(Gauge(r, "longhaul_workers", "Workers known to the coordinator, by state")) {}

void CoordinatorMetrics::RemoveJob(const std::string& id) {
  // Add returns the existing series for these labels (or makes one), which Remove then drops.
  for (auto* f : {&job_step_, &job_loss_, &job_tokens_}) f->Remove(&f->Add({{"job_id", id}}));
  job_restarts_.Remove(&job_restarts_.Add({{"job_id", id}}));
  if (auto stages = job_stages_.find(id); stages != job_stages_.end()) {
    for (int s = 0; s < stages->second; ++s) {
      for (auto* f : {&stage_straggler_, &stage_compute_, &stage_predicted_}) {
        f->Remove(&f->Add({{"job_id", id}, {"stage", absl::StrCat(s)}}));
      }
    }
    job_stages_.erase(stages);
  }
  for (v1::JobState s : kJobStates) {
    job_state_.Remove(&job_state_.Add({{"job_id", id}, {"state", Lower(JobStateName(s))}}));
  }
  auto name = job_names_.find(id);
  if (name != job_names_.end()) {
    job_info_.Remove(&job_info_.Add({{"job_id", id}, {"name", name->second}}));
    job_names_.erase(name);
  }
}

void CoordinatorMetrics::Refresh() {
  const CoordinatorService::MetricsView v = service_->ViewForMetrics(kMaxJobs);
  std::set<std::string> now;
  for (const v1::JobStatus& j : v.jobs) {
    const std::string id = absl::StrCat(j.job_id());
    now.insert(id);
    job_names_[id] = j.name();
    job_info_.Add({{"job_id", id}, {"name", j.name()}}).Set(1);
    job_step_.Add({{"job_id", id}}).Set(static_cast<double>(j.step()));
    job_loss_.Add({{"job_id", id}}).Set(j.loss());
    job_tokens_.Add({{"job_id", id}}).Set(j.tokens_per_s());
    // A counter only goes up: it is brought to the job's count (which only grows).
    prometheus::Counter& restarts = job_restarts_.Add({{"job_id", id}});
    if (j.restarts() > restarts.Value()) restarts.Increment(j.restarts() - restarts.Value());
    for (v1::JobState s : kJobStates) {
      job_state_.Add({{"job_id", id}, {"state", Lower(JobStateName(s))}}).Set(j.state() == s ? 1 : 0);
    }
    for (const v1::StagePlacement& p : j.stages()) {
      const std::map<std::string, std::string> labels = {{"job_id", id}, {"stage", absl::StrCat(p.stage())}};
      stage_straggler_.Add(labels).Set(p.straggler().empty() ? 0 : 1);
      stage_compute_.Add(labels).Set(p.compute_seconds());
      stage_predicted_.Add(labels).Set(p.predicted_compute_seconds());
    }
    int& stages = job_stages_[id];
    stages = std::max(stages, j.stages_size());
  }
  for (const std::string& id : jobs_) {
    if (!now.count(id)) RemoveJob(id);
  }
  jobs_ = std::move(now);

  // Per-worker series for live workers only (a restarted worker registers anew, so dead ones would
  // accumulate); the dead are counted in longhaul_workers{state="dead"}.
  std::map<v1::WorkerState, int> by_state;
  for (v1::WorkerState s : kWorkerStates) by_state[s] = 0;
  std::set<std::string> live;
  for (const auto& w : v.workers) {
    ++by_state[w.status.state()];
    if (w.status.state() == v1::WORKER_STATE_DEAD) continue;
    const std::string& name = w.status.info().name();
    live.insert(name);
    worker_heartbeat_age_.Add({{"worker", name}}).Set(w.heartbeat_age_seconds);
    for (v1::WorkerState s : kWorkerStates) {
      worker_state_.Add({{"worker", name}, {"state", Lower(WorkerStateName(s))}}).Set(w.status.state() == s ? 1 : 0);
    }
  }
  for (const std::string& name : worker_series_) {
    if (live.count(name)) continue;
    worker_heartbeat_age_.Remove(&worker_heartbeat_age_.Add({{"worker", name}}));
    for (v1::WorkerState s : kWorkerStates) {
      worker_state_.Remove(&worker_state_.Add({{"worker", name}, {"state", Lower(WorkerStateName(s))}}));
    }
  }
  worker_series_ = std::move(live);
  for (const auto& [s, n] : by_state) workers_.Add({{"state", Lower(WorkerStateName(s))}}).Set(n);
}

// Here rather than in coordinator.cc: the metrics are its only caller.
CoordinatorService::MetricsView CoordinatorService::ViewForMetrics(size_t max_jobs) {
  MetricsView v;
  absl::MutexLock l(&mu_);
  const absl::Time now = opt_.clock->Now();
  // Every pending or running job, and the `max_jobs` most recent others: a long job never goes
  // dark because newer jobs came and went.
  auto recent = jobs_.end();
  for (size_t n = 0; n < max_jobs && recent != jobs_.begin(); ++n) --recent;
  const auto recent_id = recent == jobs_.end() ? std::numeric_limits<uint64_t>::max() : recent->first;
  for (const auto& [id, job] : jobs_) {
    const v1::JobState s = job.status.state();
    if (id < recent_id && IsTerminal(s)) continue;
    v.jobs.push_back(job.status);
    v.jobs.back().clear_spec_yaml();
  }
  for (const auto& [id, w] : workers_) {
    const bool live = w.status.state() != v1::WORKER_STATE_DEAD;
    v.workers.push_back({w.status, live ? absl::ToDoubleSeconds(now - w.last_heartbeat) : 0.0});
  }
  return v;
}

std::string CoordinatorMetrics::DiscoveryJson() {
  const CoordinatorService::MetricsView v = service_->ViewForMetrics(0);
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& w : v.workers) {
    const v1::WorkerInfo& info = w.status.info();
    if (w.status.state() == v1::WORKER_STATE_DEAD || info.metrics_address().empty()) continue;
    groups.push_back({{"targets", {info.metrics_address()}},
                      {"labels", {{"worker", info.name()}, {"region", info.region()}, {"device", info.device()}}}});
  }
  return groups.dump();
}

}  // namespace longhaul::coordinator
