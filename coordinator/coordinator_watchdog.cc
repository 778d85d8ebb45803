// What heartbeats alone do not show (coordinator.h, docs/recovery.md): the progress watchdog (a
// stage that heart-beats but makes no step is hung, and its worker is treated as lost),
// stragglers (a stage computing much slower than predicted), and workers still running a stage
// the coordinator no longer wants there (drained: given no work until that stage ends). Heartbeats
// are checked here (CheckRunning): they carry what each stage is doing.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_cost.h"
#include "coordinator/job_spec.h"
#include "proto/stage_activity.h"

namespace longhaul::coordinator {
namespace {

// Recent steps whose median is a stage's compute time or the job's step time: enough to ride out
// a slow step (a checkpoint copy, a retransmit), few enough to follow a change of speed.
constexpr size_t kStepSamples = 16;
// A stage is judged a straggler on at least this many steps of the attempt (its first left out),
// and stays one until it is back under this fraction of the factor (no flapping at the threshold).
constexpr size_t kMinComputeSamples = 5;
constexpr double kStragglerHysteresis = 0.8;

void Log(const std::string& msg) { common::Log("coordinator", msg); }

std::string Describe(const v1::WorkerStatus& w) {
  return absl::StrCat("worker ", w.info().name(), " (id ", w.worker_id(), ", ", w.info().address(), ")");
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void Push(std::deque<double>* d, double v, size_t keep) {
  d->push_back(v);
  while (d->size() > keep) d->pop_front();
}

// A replica in its data-parallel sync waits on the others (the hung one computes elsewhere).
bool WaitsOnALink(const v1::StageActivity& a) {
  return a.phase() == v1::StageActivity::PHASE_RECEIVE || a.phase() == v1::StageActivity::PHASE_SEND ||
         a.phase() == v1::StageActivity::PHASE_SYNC;
}

}  // namespace

void CoordinatorService::Drain(Worker& w, const v1::RunningStage& r, const std::string& why) {
  SetWorkerState(w, v1::WORKER_STATE_BUSY, r.job_id(),
                 absl::StrCat("still running stage ", r.stage(), " of job ", r.job_id(), " (attempt ", r.attempt(),
                              "): ", why, "; told to stop, given no work until it has"));
  w.draining = r;  // after SetWorkerState, which clears it
  Log(absl::StrCat(Describe(w.status), ": ", w.status.note()));
  Changed();
}

void CoordinatorService::CheckRunning(Worker& w, const v1::Heartbeat& hb, Outbox* out) {
  const uint64_t running = hb.running_job_id();
  if (running == 0) {
    // Nothing runs there: a drained worker is free, and so is one whose end of a stage of an ended
    // job never arrived (a worker reserved for a running or recovering job stays reserved).
    auto j = jobs_.find(w.status.job_id());
    if (w.status.state() == v1::WORKER_STATE_BUSY &&
        (w.draining || (j != jobs_.end() && IsTerminal(j->second.status.state())))) {
      Log(absl::StrCat(Describe(w.status), " runs nothing any more: idle"));
      SetWorkerState(w, v1::WORKER_STATE_IDLE, 0, "");
      Changed();
      Schedule(out);
    }
    return;
  }
  auto j = jobs_.find(running);
  if (!w.draining && j != jobs_.end() && w.status.job_id() == running) {
    const int s = StageOf(j->second, w.status.worker_id());
    const v1::JobStatus& st = j->second.status;
    if (s >= 0 && st.state() == v1::JOB_STATE_RUNNING && hb.running_attempt() == st.attempt()) {
      if (hb.has_activity()) TrackActivity(j->second, s, hb.activity());
      return;
    }
  }
  // Anything else stops, a stage of a recovering job's failed attempt included (again: after a
  // coordinator restart nothing else told it; the worker ignores a repeated cancellation).
  v1::CoordinatorMessage c;
  c.mutable_cancel()->set_job_id(running);
  c.mutable_cancel()->set_attempt(hb.running_attempt());
  c.mutable_cancel()->set_reason("the coordinator does not have this job running on this worker");
  out->emplace_back(w.session, std::move(c));
}

void CoordinatorService::ResetProgress(Job& job) {
  const absl::Time now = opt_.clock->Now();
  job.attempt_started = now;
  job.last_step_at = now;
  job.stepped = false;
  job.past_setup.clear();
  job.stepping_since = absl::InfiniteFuture();
  job.activity.clear();
  job.compute.clear();  // the stages may be on other workers now
  for (v1::StagePlacement& p : *job.status.mutable_stages()) {
    p.set_compute_seconds(0);
    p.set_predicted_compute_seconds(0);
    p.clear_straggler();
    p.clear_dp_sync();  // the previous attempt's, perhaps another worker's
  }
}

void CoordinatorService::TrackActivity(Job& job, int stage, const v1::StageActivity& a) {
  job.activity[stage] = a;
  if (a.phase() == v1::StageActivity::PHASE_SETUP || a.phase() == v1::StageActivity::PHASE_UNSPECIFIED) return;
  if (job.past_setup.insert(stage).second && static_cast<int>(job.past_setup.size()) == job.status.stages_size()) {
    job.stepping_since = opt_.clock->Now();
  }
}

void CoordinatorService::TrackStep(Job& job, const v1::StepProgress& p) {
  // Keyed by slot (proto/replica_layout.h, as JobStatus.stages), as the activity is.
  const int slots = job.status.stages_size();
  const int S = std::max(1, job.status.spec().stages());
  const int s = Slot(job, p.stage(), p.replica());
  if (s < 0) return;
  job.last_step_at = opt_.clock->Now();
  job.stepped = true;
  job.status.set_last_progress_unix(UnixNow());
  if (job.past_setup.insert(s).second && static_cast<int>(job.past_setup.size()) == slots) {
    job.stepping_since = job.last_step_at;
  }
  job.max_checkpoint_seconds = std::max(job.max_checkpoint_seconds, p.checkpoint_seconds());
  // A stage's first step of an attempt carries its warm-up (allocations, the pipeline's fill).
  auto [samples, first] = job.compute.try_emplace(s);
  if (first) return;
  // One sample per step: replica 0's last stage (every replica's would make the window R times shorter).
  if (p.stage() == S - 1 && p.replica() == 0 && p.step_seconds() > 0) {
    Push(&job.step_seconds, p.step_seconds(), kStepSamples);
  }
  // Its own work: the step less the time it waited on its links.
  Push(&samples->second, std::max(0.0, p.step_seconds() - p.recv_wait_seconds() - p.send_wait_seconds()),
       kStepSamples);

  // Stragglers. A stage's prediction is the cost model's compute for it on its worker (the
  // worker's measured speed, job_cost.h); for a worker that measured none, the median speed of the
  // job's other stages (seconds per FLOP) applied to its FLOPs.
  const v1::JobSpec& spec = job.status.spec();
  absl::StatusOr<placement::JobShape> shape = JobShapeOf(spec);
  if (!shape.ok() || static_cast<int>(shape->stage_flops.size()) != S) return;
  std::vector<double> measured(static_cast<size_t>(slots), 0.0);
  for (const auto& [t, d] : job.compute) {
    if (d.size() >= kMinComputeSamples) measured[t] = Median(std::vector<double>(d.begin(), d.end()));
  }
  const double factor = spec.recovery().straggler_factor();
  // A slot's FLOPs a step: its stage's per micro-batch times its replica's share of the step.
  auto flops = [&](int t) {
    const int stage = std::clamp(job.status.stages(t).stage(), 0, S - 1);
    return ReplicaMicroBatches(spec, stage) * shape->stage_flops[static_cast<size_t>(stage)];
  };
  for (int t = 0; t < slots; ++t) {
    v1::StagePlacement* sp = job.status.mutable_stages(t);
    auto w = workers_.find(sp->worker_id());
    const double gflops = w == workers_.end() ? 0 : w->second.status.info().compute_gflops();
    double predicted = 0;
    if (gflops > 0) {
      predicted = flops(t) / (gflops * 1e9 * kComputeEfficiency);
    } else {
      std::vector<double> rates;
      for (int u = 0; u < slots; ++u) {
        if (u != t && measured[u] > 0 && flops(u) > 0) rates.push_back(measured[u] / flops(u));
      }
      predicted = Median(rates) * flops(t);
    }
    sp->set_compute_seconds(measured[t]);
    sp->set_predicted_compute_seconds(predicted);
    const bool was = !sp->straggler().empty();
    const bool slow = factor > 0 && measured[t] > 0 && predicted > 0 &&
                      measured[t] > (was ? kStragglerHysteresis : 1.0) * factor * predicted;
    const std::string why =
        slow ? absl::StrFormat("computes %.3g s per step, %.1fx its prediction of %.3g s (%s; recovery.straggler_factor %g)",
                               measured[t], measured[t] / predicted, predicted,
                               gflops > 0 ? absl::StrFormat("%s at %.1f GFLOP/s", sp->worker_name(), gflops)
                                          : "from the other stages' speed",
                               factor)
             : "";
    if (slow != was) {
      Log(absl::StrCat("job ", job.status.job_id(), " ", SlotName(job.status, t), " on ", sp->worker_name(),
                       slow ? absl::StrCat(" is a straggler: ", why) : " is no longer a straggler"));
    }
    sp->set_straggler(why);
  }
}

void CoordinatorService::CheckProgress(Outbox* out) {
  const absl::Time now = opt_.clock->Now();
  std::vector<uint64_t> running;
  for (const auto& [id, job] : jobs_) {
    if (job.status.state() == v1::JOB_STATE_RUNNING) running.push_back(id);
  }
  for (uint64_t id : running) {
    Job& job = jobs_.at(id);
    const v1::RecoverySpec& rs = job.status.spec().recovery();
    const int S = job.status.stages_size();
    if (rs.progress_timeout_factor() <= 0 || S == 0 || static_cast<int>(job.ended.size()) == S) continue;
    const double factor = rs.progress_timeout_factor();
    const absl::Duration floor = absl::Seconds(rs.progress_timeout_min_seconds());
    const absl::Duration startup = absl::Seconds(rs.startup_timeout_seconds());
    // The expected step: measured (the median of the last stage's recent steps), else the cost
    // model's prediction, else not known yet.
    const double expected = !job.step_seconds.empty()
                                ? Median(std::vector<double>(job.step_seconds.begin(), job.step_seconds.end()))
                                : job.status.predicted_step_seconds();
    job.status.set_expected_step_seconds(expected);

    std::vector<int> starting;  // stages not seen stepping yet
    for (int s = 0; s < S; ++s) {
      if (!job.past_setup.count(s) && !job.ended.count(s)) starting.push_back(s);
    }
    absl::Duration timeout;
    absl::Time since;
    if (!starting.empty()) {
      timeout = startup;  // building, restoring (perhaps fetching gigabytes), connecting
      since = job.attempt_started;
    } else {
      const absl::Duration base = expected > 0 ? std::max(floor, absl::Seconds(factor * expected)) : startup;
      timeout = base;
      // The attempt's first step: warm-up and the pipeline's fill.
      if (!job.stepped && expected > 0) timeout += base;
      // A step that writes a checkpoint (every stage writes at the same steps, and after the last).
      const int64_t interval = job.status.spec().checkpoint_interval();
      bool checkpoint = false;
      for (int s = 0; s < S; ++s) {
        const int64_t next = job.status.stages(s).step() + 1;
        checkpoint |= !job.ended.count(s) && ((interval > 0 && next % interval == 0) || next == job.status.steps());
      }
      if (checkpoint) timeout += std::max(floor, absl::Seconds(factor * job.max_checkpoint_seconds));
      since = std::max(job.last_step_at, job.stepping_since);
    }
    job.status.set_progress_timeout_seconds(absl::ToDoubleSeconds(timeout));
    const absl::Duration silent = now - since;
    if (silent <= timeout) continue;

    // The hung stages: those not waiting on a link — computing while their neighbours wait for
    // them — or, at the start, those still setting up.
    const std::string what =
        starting.empty()
            ? absl::StrFormat("no progress for %.1f s (expected step %s, timeout %.1f s)", absl::ToDoubleSeconds(silent),
                              expected > 0 ? absl::StrFormat("%.3g s", expected) : std::string("not known yet"),
                              absl::ToDoubleSeconds(timeout))
            : absl::StrFormat("no progress for %.1f s: not every stage started stepping within recovery.startup_timeout (%s)",
                              absl::ToDoubleSeconds(silent), absl::FormatDuration(startup));
    std::vector<int> hung;
    std::vector<std::string> doing;
    for (int s = 0; s < S; ++s) {
      if (job.ended.count(s)) continue;
      auto a = job.activity.find(s);
      if (a == job.activity.end()) {
        doing.push_back(absl::StrCat(SlotName(job.status, s), ": no activity reported"));
        continue;
      }
      doing.push_back(absl::StrCat(SlotName(job.status, s), ": ", DescribeActivity(a->second)));
      const bool setting_up = a->second.phase() == v1::StageActivity::PHASE_SETUP;
      if (starting.empty() ? !WaitsOnALink(a->second) : setting_up) hung.push_back(s);
    }
    const std::string where = absl::StrJoin(doing, "; ");
    const int restarts = job.status.restarts();
    if (!hung.empty()) {
      for (int s : hung) {
        const uint64_t wid = job.status.stages(s).worker_id();
        WorkerLost(wid, absl::StrCat(what, "; ", SlotName(job.status, s), " hung (", where, ")"), out, silent);
      }
    } else {
      // Every stage waits on a link (a connection that stalls without breaking): restart them all,
      // on the same workers; one that does not stop is lost at the recovery's stop timeout.
      BeginRecovery(job, absl::StrCat("job ", id, ": ", what, "; every stage waits on a link (", where, ")"), nullptr,
                    silent, out);
    }
    if (job.status.restarts() > restarts) {
      job.status.mutable_recoveries(job.status.recoveries_size() - 1)->set_no_progress(true);
      Persist(job);
    }
  }
}

}  // namespace longhaul::coordinator
