// longhaulctl: the command-line client of the coordinator.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/ctl_channel.h"
#include "coordinator/ctl_export.h"
#include "coordinator/ctl_identity.h"
#include "coordinator/ctl_links.h"
#include "coordinator/states.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "proto/channel_config.h"
#include "proto/replica_layout.h"
#include "common/flags.h"
#include "common/read_file.h"

namespace {

namespace v1 = longhaul::v1;
using longhaul::coordinator::IsTerminal;
using longhaul::coordinator::JobStateName;
using longhaul::coordinator::WorkerStateName;

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "longhaulctl: %s\n", msg.c_str());
  return code;
}

int RpcFail(const std::string& what, const grpc::Status& s, const std::string& addr) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail(absl::StrCat(what, ": coordinator at ", addr, " is not reachable (", s.error_message(), ")"));
  }
  return Fail(absl::StrCat(what, ": ", s.error_message()));
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", b, units[u]);
}

std::string Duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? absl::StrFormat("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60)
                   : absl::StrFormat("%d:%02d", t / 60, t % 60);
}

// A job's links as `status` shows them: emulated at a rate, paced, or neither.
std::string LinkSummary(const v1::LinkSpec& l) {
  if (l.rate_mbit() > 0) return absl::StrCat(l.rate_mbit(), " Mbit/s");
  if (l.pace_mbit() > 0) return absl::StrCat("paced at ", l.pace_mbit(), " Mbit/s");
  return "unshaped";
}

double Ratio(const v1::JobStatus& j) {
  return j.wire_bytes() > 0 ? static_cast<double>(j.raw_bytes()) / j.wire_bytes() : 0.0;
}

std::unique_ptr<grpc::ClientContext> Ctx(double seconds) {
  auto c = std::make_unique<grpc::ClientContext>();
  if (seconds > 0) c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(seconds)));
  return c;
}

// One line per restart (docs/recovery.md): what failed, how fast it was noticed, what it restored.
std::vector<std::string> DescribeRecoveries(const v1::JobStatus& j) {
  std::vector<std::string> out;
  for (const v1::Recovery& r : j.recoveries()) {
    // A hung stage still heart-beats: the progress watchdog counts from the job's last step.
    std::string line = absl::StrFormat("restart %d at step %lld: %s; detected %.2f s after the last %s", r.attempt(),
                                       static_cast<long long>(r.failed_step()), r.cause(), r.detection_seconds(),
                                       r.no_progress() ? "step (progress watchdog)" : "heartbeat");
    if (r.resumed_unix() > 0) {
      absl::StrAppend(&line, absl::StrFormat("; restarted from step %lld %.2f s after the failure",
                                             static_cast<long long>(r.restored_step()), r.resumed_unix() - r.failed_unix()));
      for (const std::string& what : r.replacements()) absl::StrAppend(&line, " (", what, ")");
    }
    if (r.recovered_unix() > 0) {
      absl::StrAppend(&line, absl::StrFormat("; training again %.2f s after the failure", r.recovery_seconds()));
    }
    out.push_back(std::move(line));
  }
  return out;
}

// The stages flagged as stragglers, "stage 1 (w1), stage 3 (w3)"; "" when none.
std::string Stragglers(const v1::JobStatus& j) {
  std::string out;
  for (const v1::StagePlacement& p : j.stages()) {
    if (!p.straggler().empty()) absl::StrAppend(&out, out.empty() ? "" : ", ", "stage ", p.stage(), " (", p.worker_name(), ")");
  }
  return out;
}

nlohmann::json Summary(const v1::JobStatus& j) {
  nlohmann::json out = {
      {"job_id", j.job_id()},
      {"name", j.name()},
      {"state", JobStateName(j.state())},
      {"error", j.error()},
      {"pending_reason", j.pending_reason()},
      {"steps", j.step()},
      {"planned_steps", j.steps()},
      {"initial_train_loss", j.initial_loss()},
      {"final_train_loss", j.loss()},
      {"tokens_per_s", j.tokens_per_s()},
      {"wire_bytes", j.wire_bytes()},
      {"raw_bytes", j.raw_bytes()},
      {"compression_ratio", Ratio(j)},
      {"mean_rel_error_forward", j.mean_rel_error()},
      {"forward_codec", j.spec().forward_codec()},
      {"backward_codec", j.spec().backward_codec()},
      {"link_rate_mbit", j.spec().links().rate_mbit()},
      {"link_pace_mbit", j.spec().links().pace_mbit()},
      {"wall_seconds", j.finished_unix() > 0 && j.started_unix() > 0 ? j.finished_unix() - j.started_unix() : 0.0},
      {"placement", j.placement()},
      {"predicted_step_seconds", j.predicted_step_seconds()},
      {"naive_step_seconds", j.naive_step_seconds()},
      {"restarts", j.restarts()},
      {"expected_step_seconds", j.expected_step_seconds()},
      {"progress_timeout_seconds", j.progress_timeout_seconds()},
  };
  nlohmann::json recoveries = nlohmann::json::array();
  for (const v1::Recovery& r : j.recoveries()) {
    recoveries.push_back({{"attempt", r.attempt()},
                          {"cause", r.cause()},
                          {"dead_worker", r.dead_worker()},
                          {"failed_unix", r.failed_unix()},
                          {"failed_step", r.failed_step()},
                          {"detection_seconds", r.detection_seconds()},
                          {"resumed_unix", r.resumed_unix()},
                          {"restored_step", r.restored_step()},
                          {"recovered_unix", r.recovered_unix()},
                          {"recovery_seconds", r.recovery_seconds()},
                          {"no_progress", r.no_progress()},
                          {"replacements", std::vector<std::string>(r.replacements().begin(), r.replacements().end())}});
  }
  out["recoveries"] = recoveries;
  nlohmann::json stages = nlohmann::json::array();
  for (const v1::StagePlacement& p : j.stages()) {
    stages.push_back({{"stage", p.stage()}, {"worker", p.worker_name()}, {"layers", {p.layer_begin(), p.layer_end()}},
                      {"checkpoint", p.checkpoint_path()}, {"compute_seconds", p.compute_seconds()},
                      {"predicted_compute_seconds", p.predicted_compute_seconds()}, {"straggler", p.straggler()},
                      {"replica", p.replica()}});
    if (p.has_dp_sync()) {
      const v1::DpSyncFigures& d = p.dp_sync();
      nlohmann::json sync = {{"seconds", d.seconds()},
                             {"step_seconds", d.step_seconds()},
                             {"busiest_link_bytes", d.busiest_link_bytes()},
                             {"has_update", d.has_update()}};
      if (d.has_update()) {
        sync["before_update_seconds"] = d.before_update_seconds();
        sync["update_seconds"] = d.update_seconds();
        sync["busiest_link_bytes_before_update"] = d.busiest_link_bytes_before_update();
        sync["busiest_link_bytes_after_update"] = d.busiest_link_bytes_after_update();
      }
      stages.back()["dp_sync"] = sync;
    }
  }
  out["stages"] = stages;
  nlohmann::json replicas = nlohmann::json::array();  // per stage
  for (int s = 0; s < j.spec().stages(); ++s) replicas.push_back(longhaul::StageReplicas(j.spec(), s));
  // One count when every stage has it (null for a per-stage list), and the count of every stage.
  out["replicas"] = longhaul::ReplicaCountsDiffer(j.spec()) ? nlohmann::json()
                                                            : nlohmann::json(longhaul::StageReplicas(j.spec(), 0));
  out["stage_replicas"] = replicas;
  out["dp_bytes_per_step"] = j.dp_bytes_per_step();
  out["dp_raw_bytes_per_step"] = j.dp_raw_bytes_per_step();
  out["dp_seconds"] = j.dp_seconds();
  out["dp_busiest_link_bytes"] = j.dp_busiest_link_bytes();
  return out;
}

void PrintDetail(const v1::JobStatus& j) {
  std::printf("job %llu (%s): %s\n", static_cast<unsigned long long>(j.job_id()), j.name().c_str(),
              JobStateName(j.state()));
  if (!j.error().empty()) std::printf("  error: %s\n", j.error().c_str());
  if (!j.pending_reason().empty()) {
    std::printf("  %s: %s\n", j.state() == v1::JOB_STATE_RECOVERING ? "recovering" : "pending", j.pending_reason().c_str());
  }
  if (j.restarts() > 0) std::printf("  restarts: %d (attempt %d)\n", j.restarts(), j.attempt());
  for (const std::string& line : DescribeRecoveries(j)) std::printf("  %s\n", line.c_str());
  std::printf("  step %lld / %lld   loss %.4f (initial %.4f)   %.0f tokens/s\n", static_cast<long long>(j.step()),
              static_cast<long long>(j.steps()), j.loss(), j.initial_loss(), j.tokens_per_s());
  std::printf("  links: forward %s, backward %s, %s; wire %s vs %s uncompressed (%.2fx); forward rel. error %.4f\n",
              j.spec().forward_codec().c_str(), j.spec().backward_codec().c_str(),
              LinkSummary(j.spec().links()).c_str(),
              HumanBytes(j.wire_bytes()).c_str(), HumanBytes(j.raw_bytes()).c_str(), Ratio(j), j.mean_rel_error());
  if (longhaul::HasReplicas(j.spec())) {  // docs/replicated-stages.md
    std::printf("  data parallel: %s, %s; %s per step vs %s as fp32, sync %.3f s\n",
                longhaul::DescribeStages(j.spec()).c_str(), j.spec().data_parallel().codec().c_str(),
                HumanBytes(j.dp_bytes_per_step()).c_str(), HumanBytes(j.dp_raw_bytes_per_step()).c_str(), j.dp_seconds());
  }
  if (!j.placement().empty()) {
    std::printf("  placement: %s", j.placement().c_str());
    if (j.predicted_step_seconds() > 0) {
      std::printf(" (predicted step %.3f s, naive order %.3f s)", j.predicted_step_seconds(), j.naive_step_seconds());
    }
    std::printf("\n");
  }
  if (j.state() == v1::JOB_STATE_RUNNING && j.progress_timeout_seconds() > 0) {
    const double since =
        j.last_progress_unix() > 0 ? absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) - j.last_progress_unix() : -1;
    std::printf("  watchdog: expected step %s; a stage is hung after %.1f s without a step%s\n",
                j.expected_step_seconds() > 0 ? absl::StrFormat("%.3f s", j.expected_step_seconds()).c_str()
                                              : "not known yet",
                j.progress_timeout_seconds(),
                since >= 0 ? absl::StrFormat(" (last step %.1f s ago)", std::max(0.0, since)).c_str() : "");
  }
  for (const v1::StagePlacement& p : j.stages()) {
    std::string compute;
    if (p.compute_seconds() > 0) {
      compute = absl::StrFormat(", compute %.3g s/step", p.compute_seconds());
      if (p.predicted_compute_seconds() > 0) {
        absl::StrAppend(&compute, absl::StrFormat(" (predicted %.3g s)", p.predicted_compute_seconds()));
      }
    }
    if (p.has_dp_sync()) {
      absl::StrAppend(&compute, absl::StrFormat(", sync %.3f s", p.dp_sync().seconds()));
      if (p.dp_sync().busiest_link_bytes() > 0) {
        absl::StrAppend(&compute, ", ", HumanBytes(p.dp_sync().busiest_link_bytes()), " to one replica across regions");
      }
    }
    std::printf("  stage %d%s: worker %s, layers %d..%d, step %lld%s%s%s\n", p.stage(),
                longhaul::HasReplicas(j.spec()) ? absl::StrCat(" replica ", p.replica()).c_str() : "",
                p.worker_name().c_str(),
                p.layer_begin(), p.layer_end() - 1, static_cast<long long>(p.step()), compute.c_str(),
                p.checkpoint_path().empty() ? "" : ", checkpoint ", p.checkpoint_path().c_str());
    if (!p.straggler().empty()) std::printf("    STRAGGLER: %s\n", p.straggler().c_str());
  }
}

class Ctl {
 public:
  explicit Ctl(std::string addr) : addr_(std::move(addr)) {
    stub_ = v1::Coordinator::NewStub(longhaul::coordinator::CoordinatorChannel(addr_));
  }

  int Workers(bool json) {
    v1::ListWorkersResponse r;
    grpc::Status s = stub_->ListWorkers(Ctx(10).get(), {}, &r);
    if (!s.ok()) return RpcFail("workers", s, addr_);
    if (json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& w : r.workers()) {
        out.push_back({{"id", w.worker_id()}, {"name", w.info().name()}, {"address", w.info().address()},
                       {"region", w.info().region()}, {"device", w.info().device()},
                       {"state", WorkerStateName(w.state())}, {"job_id", w.job_id()}, {"note", w.note()}});
      }
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }
    std::printf("%-4s %-16s %-22s %-10s %-7s %-5s %s\n", "ID", "NAME", "ADDRESS", "REGION", "STATE", "JOB", "NOTE");
    for (const auto& w : r.workers()) {
      std::printf("%-4llu %-16s %-22s %-10s %-7s %-5s %s\n", static_cast<unsigned long long>(w.worker_id()),
                  w.info().name().c_str(), w.info().address().c_str(), w.info().region().c_str(),
                  WorkerStateName(w.state()), w.job_id() ? std::to_string(w.job_id()).c_str() : "-",
                  w.note().c_str());
    }
    return 0;
  }

  int Submit(const std::string& path, int64_t steps, bool watch, const std::string& summary) {
    absl::StatusOr<std::string> yaml = longhaul::common::ReadFile(path);
    if (!yaml.ok()) return Fail(std::string(yaml.status().message()));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(*yaml);
    req.set_steps_override(steps);
    v1::SubmitJobResponse resp;
    grpc::Status s = stub_->SubmitJob(Ctx(30).get(), req, &resp);
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      std::fprintf(stderr, "longhaulctl: %s was rejected:\n", path.c_str());
      std::istringstream lines(s.error_message());
      for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "  - %s\n", line.c_str());
      return 1;
    }
    if (!s.ok()) return RpcFail("submit", s, addr_);
    std::printf("submitted job %llu\n", static_cast<unsigned long long>(resp.job_id()));
    std::fflush(stdout);
    return watch ? Watch(resp.job_id(), summary) : 0;
  }

  // `job` empty: every job.
  int Status(const std::vector<uint64_t>& job, bool json) {
    if (job.empty()) {
      v1::ListJobsResponse r;
      grpc::Status s = stub_->ListJobs(Ctx(10).get(), {}, &r);
      if (!s.ok()) return RpcFail("status", s, addr_);
      if (json) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& j : r.jobs()) out.push_back(Summary(j));
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
      }
      // NOTE: a failed job's error, or why a pending one waits.
      std::printf("%-5s %-16s %-10s %-13s %-9s %-10s %s\n", "JOB", "NAME", "STATE", "STEP", "LOSS", "TOKENS/S", "NOTE");
      for (const auto& j : r.jobs()) {
        const bool waiting = j.state() == v1::JOB_STATE_PENDING || j.state() == v1::JOB_STATE_RECOVERING;
        const std::string stragglers = Stragglers(j);
        const std::string note = waiting                 ? j.pending_reason()
                                 : !j.error().empty()    ? j.error()
                                 : !stragglers.empty()   ? absl::StrCat("straggler: ", stragglers)
                                                         : "";
        std::printf("%-5llu %-16s %-10s %-13s %-9.4f %-10.0f %s\n", static_cast<unsigned long long>(j.job_id()),
                    j.name().c_str(), JobStateName(j.state()),
                    absl::StrCat(j.step(), "/", j.steps()).c_str(), j.loss(), j.tokens_per_s(), note.c_str());
      }
      return 0;
    }
    v1::GetJobRequest req;
    req.set_job_id(job[0]);
    v1::JobStatus j;
    grpc::Status s = stub_->GetJob(Ctx(10).get(), req, &j);
    if (!s.ok()) return RpcFail("status", s, addr_);
    if (json) {
      std::printf("%s\n", Summary(j).dump(2).c_str());
    } else {
      PrintDetail(j);
    }
    return 0;
  }

  int Cancel(uint64_t id) {
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    grpc::Status s = stub_->CancelJob(Ctx(10).get(), req, &resp);
    if (!s.ok()) return RpcFail("cancel", s, addr_);
    std::printf("job %llu cancelled\n", static_cast<unsigned long long>(id));
    return 0;
  }

  int Watch(uint64_t id, const std::string& summary_path) {
    const bool tty = isatty(fileno(stderr));
    v1::WatchJobRequest req;
    req.set_job_id(id);
    v1::JobStatus last;
    bool have = false;
    double last_print = 0;
    v1::JobState shown = v1::JOB_STATE_UNSPECIFIED;  // printed at every change of state, tty or not
    // The stream may break if the coordinator restarts; re-attach a few times before giving up.
    for (int attempt = 0; attempt < 5 && !(have && IsTerminal(last.state())); ++attempt) {
      grpc::ClientContext ctx;
      std::unique_ptr<grpc::ClientReader<v1::JobStatus>> r = stub_->WatchJob(&ctx, req);
      v1::JobStatus j;
      while (r->Read(&j)) {
        last = j;
        have = true;
        const double now = absl::ToUnixSeconds(absl::Now());
        if (tty || IsTerminal(j.state()) || now - last_print >= 5 || j.state() != shown) {
          PrintProgress(j, tty);
          last_print = now;
          shown = j.state();
        }
      }
      grpc::Status s = r->Finish();
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) return RpcFail("watch", s, addr_);
      if (!s.ok() && !(have && IsTerminal(last.state()))) {
        std::fprintf(stderr, "\nlonghaulctl: watch interrupted (%s); re-attaching\n", s.error_message().c_str());
        absl::SleepFor(absl::Seconds(1 << attempt));
      }
    }
    if (tty) std::fprintf(stderr, "\n");
    if (!have) return Fail(absl::StrCat("watch: no status for job ", id, " from ", addr_));
    // The final status carries every stage's checkpoint path.
    v1::GetJobRequest g;
    g.set_job_id(id);
    v1::JobStatus full;
    if (stub_->GetJob(Ctx(10).get(), g, &full).ok()) last = full;
    PrintSummary(last);
    if (!summary_path.empty()) {
      std::ofstream out(summary_path);
      out << Summary(last).dump(2) << "\n";
      if (!out) return Fail(absl::StrCat("cannot write ", summary_path));
      std::printf("summary written to %s\n", summary_path.c_str());
    }
    return last.state() == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
  }

 private:
  static void PrintProgress(const v1::JobStatus& j, bool tty) {
    const double frac = j.steps() > 0 ? static_cast<double>(j.step()) / j.steps() : 0;
    const int width = 24, fill = static_cast<int>(frac * width);
    std::string bar(width, ' ');
    for (int i = 0; i < fill && i < width; ++i) bar[i] = '=';
    if (fill < width) bar[fill] = '>';
    const v1::JobSpec& sp = j.spec();
    const double tokens_per_step = static_cast<double>(sp.micro_batches()) * sp.micro_batch_size() * sp.model().context();
    const double eta = j.tokens_per_s() > 0 ? (j.steps() - j.step()) * tokens_per_step / j.tokens_per_s() : -1;
    const std::string line =
        j.state() == v1::JOB_STATE_PENDING || j.state() == v1::JOB_STATE_RECOVERING
            ? absl::StrFormat("[%s] %-9s step %lld/%lld  %s", bar, JobStateName(j.state()),
                              static_cast<long long>(j.step()), static_cast<long long>(j.steps()), j.pending_reason())
        : j.step() == 0 && !IsTerminal(j.state())
            ? absl::StrFormat("[%s] %-9s waiting for the first step (%d stages)", bar, JobStateName(j.state()),
                              sp.stages())
            : absl::StrFormat("[%s] %-9s step %lld/%lld  loss %.4f  %.0f tok/s  ", bar, JobStateName(j.state()),
                              static_cast<long long>(j.step()), static_cast<long long>(j.steps()), j.loss(),
                              j.tokens_per_s()) +
                  // One stage has no pipeline links to compress.
                  (sp.stages() > 1 ? absl::StrFormat("compression %.1fx  err %.3f  ", Ratio(j), j.mean_rel_error())
                                   : "") +
                  absl::StrFormat("ETA %s", Duration(eta)) +
                  (j.restarts() > 0 ? absl::StrFormat("  restarts %d", j.restarts()) : "") +
                  (Stragglers(j).empty() ? "" : absl::StrCat("  straggler: ", Stragglers(j)));
    if (tty) {
      std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  static void PrintSummary(const v1::JobStatus& j) {
    std::printf("\n== job %llu (%s) %s ==\n", static_cast<unsigned long long>(j.job_id()), j.name().c_str(),
                JobStateName(j.state()));
    if (!j.error().empty()) std::printf("error:        %s\n", j.error().c_str());
    std::printf("steps:        %lld of %lld in %s\n", static_cast<long long>(j.step()),
                static_cast<long long>(j.steps()),
                Duration(j.finished_unix() > 0 ? j.finished_unix() - j.started_unix() : -1).c_str());
    std::printf("train loss:   %.4f -> %.4f\n", j.initial_loss(), j.loss());
    std::printf("throughput:   %.0f tokens/s\n", j.tokens_per_s());
    for (const std::string& line : DescribeRecoveries(j)) std::printf("recovery:     %s\n", line.c_str());
    if (j.spec().stages() > 1) {
      std::printf("on the wire:  %s sent, %s uncompressed (%.2fx smaller); forward rel. L2 error %.4f\n",
                  HumanBytes(j.wire_bytes()).c_str(), HumanBytes(j.raw_bytes()).c_str(), Ratio(j), j.mean_rel_error());
    } else {
      std::printf("on the wire:  no pipeline links (one stage)\n");
    }
    for (const v1::StagePlacement& p : j.stages()) {
      if (!p.checkpoint_path().empty()) {
        std::printf("checkpoint:   stage %d%s (%s): %s\n", p.stage(),
                    longhaul::HasReplicas(j.spec()) ? absl::StrCat(" replica ", p.replica()).c_str() : "",
                    p.worker_name().c_str(), p.checkpoint_path().c_str());
      }
    }
  }

  std::string addr_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string coordinator = "localhost:7400";
  CLI::App app{"The command-line client of the coordinator.", "longhaulctl"};
  app.option_defaults()->always_capture_default();
  app.add_option("--coordinator", coordinator, "coordinator address (else $LONGHAUL_COORDINATOR, else the default)")
      ->type_name("HOST:PORT")
      ->envname("LONGHAUL_COORDINATOR");
  longhaul::coordinator::CtlCredentialFlags creds;
  longhaul::coordinator::AddCredentialFlags(app, &creds);
  // --coordinator may also follow the command (`longhaulctl submit job.yaml --coordinator=...`).
  app.fallthrough();
  app.require_subcommand(1);

  bool json = false;
  CLI::App* workers = app.add_subcommand("workers", "list registered workers and their state");
  workers->add_flag("--json", json, "machine-readable output");

  std::string spec, summary;
  int64_t steps = 0;
  bool watch = false;
  CLI::App* submit = app.add_subcommand(
      "submit", "submit a job spec; an invalid spec is rejected with every problem listed");
  submit->add_option("spec", spec, "the job spec")->type_name("JOB.yaml")->required();
  submit->add_option("--steps", steps, "train this many steps instead of the spec's (0: the spec's)")->type_name("N");
  submit->add_flag("--watch", watch, "then follow the job like `watch`");
  submit->add_option("--summary-json", summary, "with --watch (implied): write the final summary here as JSON")
      ->type_name("PATH");

  std::vector<uint64_t> status_job;
  CLI::App* status = app.add_subcommand("status", "one job in detail, or a table of all jobs");
  status->add_option("job", status_job, "the job id (none: all jobs)")
      ->type_name("JOB")
      ->expected(0, 1)
      ->default_str("");
  status->add_flag("--json", json, "machine-readable output");

  uint64_t job = 0;
  CLI::App* watch_cmd = app.add_subcommand(
      "watch", "live progress (step, loss, tokens/s, compression, ETA) until the job ends, then a summary;\n"
               "exit status 0 only if the job succeeded");
  watch_cmd->add_option("job", job, "the job id")->type_name("JOB")->required();
  watch_cmd->add_option("--summary-json", summary, "write the final summary here as JSON")->type_name("PATH");

  CLI::App* cancel = app.add_subcommand("cancel", "stop a pending or running job");
  cancel->add_option("job", job, "the job id")->type_name("JOB")->required();

  longhaul::coordinator::ExportFlags export_flags;
  CLI::App* export_cmd = longhaul::coordinator::AddExportCommand(app, &export_flags);

  longhaul::coordinator::LinksFlags links_flags;
  CLI::App* links_cmd = longhaul::coordinator::AddLinksCommand(app, &links_flags);
  longhaul::coordinator::PlanFlags plan_flags;
  CLI::App* plan_cmd = longhaul::coordinator::AddPlanCommand(app, &plan_flags);

  longhaul::coordinator::IdentityFlags identity_flags;
  auto [token_create, identity_create] = longhaul::coordinator::AddIdentityCommands(app, &identity_flags);

  // After the subcommands, which would inherit it.
  app.footer(
      "A job spec's keys and defaults are documented in coordinator/job_spec.h; an example is\n"
      "deploy/jobs/demo.yaml. `longhaulctl COMMAND --help` shows a command's flags.\n"
      "Identity: TLS with the admin certificate the coordinator wrote into its --pki-dir, unless --cert/--key/\n"
      "--ca name another (`longhaulctl identity create`); docs/security.md.");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  if (!(plan_cmd->parsed() && plan_flags.simulate)) {  // (a simulation talks to no coordinator)
    if (absl::Status s = longhaul::coordinator::UseCredentials(creds, coordinator); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (token_create->parsed()) return longhaul::coordinator::RunTokenCreate(coordinator, identity_flags);
  if (identity_create->parsed()) return longhaul::coordinator::RunIdentityCreate(coordinator, identity_flags);
  Ctl ctl(coordinator);
  if (workers->parsed()) return ctl.Workers(json);
  if (submit->parsed()) {
    if (steps < 0) return longhaul::common::FlagError(app, "--steps needs a non-negative integer (0: the spec's)");
    return ctl.Submit(spec, steps, watch || !summary.empty(), summary);
  }
  if (status->parsed()) return ctl.Status(status_job, json);
  if (watch_cmd->parsed()) return ctl.Watch(job, summary);
  if (export_cmd->parsed()) return longhaul::coordinator::RunExport(coordinator, export_flags);
  if (links_cmd->parsed()) return longhaul::coordinator::RunLinks(coordinator, links_flags);
  if (plan_cmd->parsed()) return longhaul::coordinator::RunPlan(coordinator, plan_flags);
  return ctl.Cancel(job);
}
