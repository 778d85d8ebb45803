// Recovery of running jobs (coordinator.h, docs/recovery.md): a stage lost or failed sends the job
// to RECOVERING; once the failed attempt's stages have all stopped and the lost ones have spare
// workers, every stage restarts from the newest checkpoint step they can all be restored from.
// Also: the end of a stage (OnFinished) and re-attaching running jobs' workers after a coordinator
// restart. The checkpoint bookkeeping is in coordinator_checkpoints.cc.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_spec.h"

namespace longhaul::coordinator {
namespace {

void Log(const std::string& msg) { common::Log("coordinator", msg); }

std::string Describe(const v1::WorkerStatus& w) {
  return absl::StrCat("worker ", w.info().name(), " (id ", w.worker_id(), ", ", w.info().address(), ")");
}

std::string Secs(absl::Duration d) { return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d)); }

std::string Stages(const std::vector<int>& s) {
  return absl::StrCat(s.size() == 1 ? "stage " : "stages ", absl::StrJoin(s, ", "));
}

}  // namespace

int CoordinatorService::StageOf(const Job& job, uint64_t worker_id) const {
  for (int i = 0; i < job.status.stages_size(); ++i) {
    if (job.status.stages(i).worker_id() == worker_id) return i;
  }
  return -1;
}

bool CoordinatorService::Alive(uint64_t worker_id) const {
  auto it = workers_.find(worker_id);
  return it != workers_.end() && it->second.status.state() != v1::WORKER_STATE_DEAD;
}

void CoordinatorService::BeginRecovery(Job& job, const std::string& cause, const Worker* dead, absl::Duration detection,
                                       Outbox* out) {
  const uint64_t id = job.status.job_id();
  const int S = job.status.stages_size();
  const int dead_stage = dead != nullptr ? StageOf(job, dead->status.worker_id()) : -1;
  if (job.status.state() == v1::JOB_STATE_RECOVERING) {
    // Another failure while recovering: one more stage to replace.
    if (dead_stage >= 0) {
      job.lost.insert(dead_stage);
      job.stopped.insert(dead_stage);
    }
    if (job.status.recoveries_size() > 0) {
      v1::Recovery* r = job.status.mutable_recoveries(job.status.recoveries_size() - 1);
      if (dead != nullptr && r->dead_worker().empty()) {
        // A neighbour's broken link usually reports a death before the dead worker's session is
        // seen closed: the death is the cause, noticed when the link broke.
        r->set_dead_worker(dead->status.info().name());
        r->set_cause(absl::StrCat(cause, "; first noticed as: ", r->cause()));
        r->set_detection_seconds(
            std::max(0.0, absl::ToDoubleSeconds(detection) - (UnixNow() - r->failed_unix())));
      } else {
        r->set_cause(absl::StrCat(r->cause(), "; then ", cause));
      }
    }
    Log(absl::StrCat("job ", id, " (recovering): ", cause));
    Persist(job);
    Changed();
    return;
  }
  if (job.status.state() != v1::JOB_STATE_RUNNING || S == 0) return;
  const v1::RecoverySpec& rs = job.status.spec().recovery();
  if (job.status.restarts() >= rs.max_restarts()) {
    FailJob(job,
            absl::StrCat(cause, rs.max_restarts() == 0 ? " (recovery.max_restarts is 0)"
                                                       : absl::StrCat("; gave up after ", job.status.restarts(),
                                                                      " restart(s) (recovery.max_restarts)")),
            v1::JOB_STATE_FAILED, out);
    return;
  }
  const absl::Time now = opt_.clock->Now();
  const int old = job.status.attempt();
  job.status.set_state(v1::JOB_STATE_RECOVERING);
  job.status.set_restarts(job.status.restarts() + 1);
  job.status.set_attempt(old + 1);
  v1::Recovery* r = job.status.add_recoveries();
  r->set_attempt(old + 1);
  r->set_cause(cause);
  if (dead != nullptr) r->set_dead_worker(dead->status.info().name());
  r->set_failed_unix(UnixNow());
  r->set_detection_seconds(absl::ToDoubleSeconds(detection));
  r->set_failed_step(job.status.step());
  job.lost.clear();
  job.stopped = job.ended;  // stages that already reported the attempt's end
  const std::string reason = absl::StrCat("job ", id, " is recovering: ", cause);
  for (int s = 0; s < S; ++s) {
    const uint64_t wid = job.status.stages(s).worker_id();
    auto it = workers_.find(wid);
    if (s == dead_stage || it == workers_.end() || it->second.status.state() == v1::WORKER_STATE_DEAD) {
      job.lost.insert(s);
      job.stopped.insert(s);
      continue;
    }
    Worker& w = it->second;
    if (w.status.job_id() != id) {
      job.stopped.insert(s);
      if (w.status.state() == v1::WORKER_STATE_IDLE) {
        // Alive and idle (it registered again after a coordinator restart): reserved for the restart.
        SetWorkerState(w, v1::WORKER_STATE_BUSY, id, "");
      } else {
        job.lost.insert(s);  // meanwhile given to another job: the stage needs a spare
      }
      continue;
    }
    // Its links to a dead neighbour break at once; a hung one's may not: every stage is told.
    if (!job.stopped.count(s) && w.session) {
      v1::CoordinatorMessage m;
      m.mutable_cancel()->set_job_id(id);
      m.mutable_cancel()->set_reason(reason);
      m.mutable_cancel()->set_attempt(old);
      out->emplace_back(w.session, std::move(m));
    }
  }
  job.stop_by = now + opt_.stop_timeout;
  job.recover_by = now + absl::Seconds(rs.wait_seconds());
  job.reattach_by = absl::InfiniteFuture();
  Log(absl::StrCat("job ", id, " RECOVERING (restart ", job.status.restarts(), " of at most ", rs.max_restarts(),
                   "; unnoticed for ", absl::StrFormat("%.3f", absl::ToDoubleSeconds(detection)), " s) at step ",
                   job.status.step(), ": ", cause));
  Persist(job);
  Changed();
}

void CoordinatorService::AdvanceRecoveries(std::vector<uint64_t>* idle, Outbox* out) {
  const absl::Time now = opt_.clock->Now();
  for (auto& [id, job] : jobs_) {
    if (job.status.state() != v1::JOB_STATE_RECOVERING) continue;
    const int S = job.status.stages_size();
    std::string why;
    std::vector<int> running;
    for (int s = 0; s < S; ++s) {
      if (!job.stopped.count(s)) running.push_back(s);
    }
    const std::vector<int> lost(job.lost.begin(), job.lost.end());
    std::vector<std::string> away;  // kept stages whose worker has no session (reconnecting)
    for (int s = 0; s < S; ++s) {
      auto w = workers_.find(job.status.stages(s).worker_id());
      if (!job.lost.count(s) && (w == workers_.end() || !w->second.session)) {
        away.push_back(job.status.stages(s).worker_name());
      }
    }
    if (!running.empty()) {
      why = absl::StrCat("waiting for ", Stages(running), " of the failed attempt to stop");
    } else if (!away.empty()) {
      why = absl::StrCat("waiting for ", absl::StrJoin(away, ", "), " to reconnect");
    } else if (idle->size() < lost.size()) {
      std::vector<std::string> names;
      for (int s : lost) names.push_back(job.status.stages(s).worker_name());
      const std::string need =
          absl::StrCat(lost.size(), lost.size() == 1 ? " spare worker" : " spare workers", " to replace ",
                       absl::StrJoin(names, ", "), " (", Stages(lost), "); ", idle->size(), " idle");
      if (now >= job.recover_by) {
        const v1::Recovery& r = job.status.recoveries(job.status.recoveries_size() - 1);
        FailJob(job,
                absl::StrCat(r.cause(), "; no spare worker came within recovery.wait (",
                             absl::FormatDuration(absl::Seconds(job.status.spec().recovery().wait_seconds())),
                             "): needed ", need),
                v1::JOB_STATE_FAILED, out);
        continue;
      }
      why = absl::StrCat("waiting for ", need, "; fails in ", Secs(job.recover_by - now),
                         " (recovery.wait) unless workers register");
    } else {
      std::vector<uint64_t> spares(idle->begin(), idle->begin() + static_cast<std::ptrdiff_t>(lost.size()));
      idle->erase(idle->begin(), idle->begin() + static_cast<std::ptrdiff_t>(lost.size()));
      Resume(job, spares, out);
      continue;
    }
    // The countdown changes every tick; the reason is persisted only when its kind changes.
    const bool same = job.status.pending_reason().substr(0, 20) == why.substr(0, 20);
    job.status.set_pending_reason(why);
    if (!same) Persist(job);
    Changed();
  }
}

void CoordinatorService::Resume(Job& job, const std::vector<uint64_t>& spares, Outbox* out) {
  const uint64_t id = job.status.job_id();
  const v1::JobSpec& spec = job.status.spec();
  const int S = job.status.stages_size();
  // Restore points: per stage, the steps whose checkpoint a live worker holds, and who (0: the
  // stage's dead worker's disk, reachable when the spec's checkpoint dir is shared).
  std::vector<std::map<int64_t, std::vector<uint64_t>>> holders(S);
  for (int s = 0; s < S; ++s) {
    const v1::StagePlacement& p = job.status.stages(s);
    for (int64_t step : p.local_checkpoints()) {
      if (Alive(p.worker_id())) {
        holders[s][step].push_back(p.worker_id());
      } else if (!spec.checkpoint_dir().empty()) {
        holders[s][step].push_back(0);
      }
    }
    for (const v1::CheckpointReplica& c : p.replicas()) {
      if (Alive(c.worker_id())) holders[s][c.step()].push_back(c.worker_id());
    }
  }
  int64_t restore = 0;  // the newest step every stage has; 0: from the start
  for (const auto& [step, who] : holders[0]) {
    bool all = true;
    for (int s = 1; s < S && all; ++s) all = holders[s].count(step) > 0;
    if (all) restore = std::max(restore, step);
  }
  v1::Recovery* r = job.status.mutable_recoveries(job.status.recoveries_size() - 1);
  r->set_resumed_unix(UnixNow());
  r->set_restored_step(restore);
  r->clear_replacements();
  const int attempt = job.status.attempt();
  size_t next_spare = 0;
  std::vector<Worker*> ws(S);
  for (int s = 0; s < S; ++s) {
    v1::StagePlacement* p = job.status.mutable_stages(s);
    const std::string old_name = p->worker_name();
    const bool replaced = job.lost.count(s) > 0;
    if (replaced) {
      Worker& w = workers_.at(spares[next_spare++]);
      p->set_worker_id(w.status.worker_id());
      p->set_worker_name(w.status.info().name());
      SetWorkerState(w, v1::WORKER_STATE_BUSY, id, "");
    }
    ws[s] = &workers_.at(p->worker_id());
    // What each stage restores from, for the record.
    std::vector<std::string> from;
    if (restore > 0) {
      for (uint64_t h : holders[s][restore]) {
        if (h == 0) {
          from.push_back("the shared checkpoint dir");
        } else if (h == p->worker_id()) {
          from.push_back("its own disk");
        } else {
          from.push_back(absl::StrCat("the copy on ", workers_.at(h).status.info().name()));
        }
      }
    }
    if (replaced || restore == 0) {
      r->add_replacements(absl::StrCat(SlotName(job.status, s), ": ", old_name, replaced ? absl::StrCat(" -> ", p->worker_name()) : "",
                                       restore > 0 ? absl::StrCat(", restored from ", absl::StrJoin(from, " or "))
                                                   : ", from the start (no checkpoint every stage has)"));
    }
    // Steps after the restore point are re-run and checkpointed again.
    std::vector<int64_t> local;
    if (!replaced) {
      for (int64_t step : p->local_checkpoints()) {
        if (step <= restore) local.push_back(step);
      }
    } else if (restore > 0) {
      local.push_back(restore);  // fetched next to its own checkpoints
    }
    SetLocalCheckpoints(p, local);
    google::protobuf::RepeatedPtrField<v1::CheckpointReplica> keep;
    for (const v1::CheckpointReplica& c : p->replicas()) {
      if (c.step() <= restore && Alive(c.worker_id())) *keep.Add() = c;
    }
    p->mutable_replicas()->Swap(&keep);
    p->set_step(restore);
  }
  for (int s = 0; s < S; ++s) {
    const v1::StagePlacement& p = job.status.stages(s);
    v1::CoordinatorMessage m;
    v1::StageAssignment* a = m.mutable_assign();
    FillAssignment(job, ws, s, a);
    a->set_restore_step(restore);
    for (uint64_t h : holders[s][restore]) {
      if (restore == 0 || h == 0 || h == p.worker_id()) continue;
      const Worker& src = workers_.at(h);
      v1::StagePeer* from = a->add_restore_from();
      from->set_worker_id(h);
      from->set_name(src.status.info().name());
      from->set_address(src.status.info().address());
    }
    out->emplace_back(ws[s]->session, std::move(m));
  }
  job.status.set_state(v1::JOB_STATE_RUNNING);
  job.status.clear_pending_reason();
  job.status.set_step(restore);
  job.floor = std::min(job.floor, restore);
  job.latest.clear();
  job.ended.clear();
  job.finished.clear();
  job.stopped.clear();
  job.lost.clear();
  ResetProgress(job);
  Log(absl::StrCat("job ", id, " restarts as attempt ", attempt, " from step ", restore, " (it had reached step ",
                   r->failed_step(), ") ", absl::StrFormat("%.3f", r->resumed_unix() - r->failed_unix()),
                   " s after the failure: ", absl::StrJoin(r->replacements(), "; ")));
  Persist(job);
  Changed();
}

void CoordinatorService::OnFinished(Worker& w, const v1::JobFinished& f, Outbox* out) {
  // A drained worker runs nothing else (it is given no work): any end of that job is its stage's.
  if (w.draining && w.draining->job_id() == f.job_id()) {
    Log(absl::StrCat(Describe(w.status), " stopped job ", f.job_id(), " stage ", f.stage(), ", which it no longer held: idle"));
    SetWorkerState(w, v1::WORKER_STATE_IDLE, 0, "");
    Changed();
    Schedule(out);
    return;
  }
  auto it = jobs_.find(f.job_id());
  const int s = it == jobs_.end() ? -1 : StageOf(it->second, w.status.worker_id());
  const int fs = it == jobs_.end() ? f.stage() : Slot(it->second, f.stage(), f.replica());
  if (it == jobs_.end() || IsTerminal(it->second.status.state()) || s < 0 || s != fs) {
    // A late end of a stage this worker no longer holds (it now holds stage s of the same job)
    // changes nothing; otherwise the worker is free.
    if (w.status.job_id() == f.job_id() && !(s >= 0 && s != fs && it != jobs_.end() &&
                                             !IsTerminal(it->second.status.state()))) {
      SetWorkerState(w, v1::WORKER_STATE_IDLE, 0, "");
    }
    Changed();
    Schedule(out);
    return;
  }
  Job& job = it->second;
  // The worker stays reserved for the job (BUSY) until the job ends: a restart needs it again.
  if (job.status.state() == v1::JOB_STATE_RUNNING && f.attempt() == job.status.attempt()) {
    job.ended.insert(s);
    job.last_step_at = opt_.clock->Now();  // progress, for the watchdog
    job.status.mutable_stages(s)->set_checkpoint_path(f.checkpoint_path());
    const std::string what = absl::StrCat(Describe(w.status), " failed: ", f.error());
    if (f.ok()) {
      job.finished[s] = true;
      if (static_cast<int>(job.finished.size()) == job.status.stages_size()) {
        job.status.set_state(v1::JOB_STATE_SUCCEEDED);
        job.status.set_finished_unix(UnixNow());
        Log(absl::StrCat("job ", job.status.job_id(), " succeeded: ", job.status.step(), " steps, final loss ",
                         job.status.loss(), ", ", job.status.restarts(), " restart(s)"));
        ReleaseWorkers(job);
      }
      Persist(job);
    } else if (f.retryable()) {
      BeginRecovery(job, what, nullptr, absl::ZeroDuration(), out);
    } else {
      FailJob(job, what, v1::JOB_STATE_FAILED, out);
    }
  } else if (job.status.state() == v1::JOB_STATE_RECOVERING && f.attempt() < job.status.attempt()) {
    job.stopped.insert(s);  // a stage of the failed attempt stopped
  }
  Changed();
  Schedule(out);
}

void CoordinatorService::Reattach(Worker& w, const v1::RunningStage& r) {
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end()) return Drain(w, r, absl::StrCat("job ", r.job_id(), " is unknown here"));
  Job& job = it->second;
  const int s = Slot(job, r.stage(), r.replica());
  if (s < 0 || job.status.stages(s).worker_id() != w.status.worker_id()) {
    return Drain(w, r, absl::StrCat("stage ", s, " of job ", r.job_id(), " has moved to another worker"));
  }
  if (job.status.state() == v1::JOB_STATE_RUNNING && r.attempt() == job.status.attempt()) {
    job.attached.insert(s);
  } else if (!(job.status.state() == v1::JOB_STATE_RECOVERING && r.attempt() < job.status.attempt() &&
               !job.lost.count(s))) {
    // Not a stage this job runs now (or one given up for lost, whose stage goes to a spare): its
    // heartbeat gets it cancelled, and it takes no work until that stage has ended.
    Drain(w, r, absl::StrCat("job ", r.job_id(), " does not run stage ", s, " (attempt ", r.attempt(), ") here any more"));
    return;
  }
  SetWorkerState(w, v1::WORKER_STATE_BUSY, job.status.job_id(), "");
  Log(absl::StrCat(Describe(w.status), " re-attached to job ", r.job_id(), " stage ", s, " (attempt ", r.attempt(),
                   ")"));
  Changed();
}

absl::Status CoordinatorService::CheckResumable(const v1::JobStatus& job) {
  const int stages = job.spec().stages();
  if (stages < 1) return absl::DataLossError(absl::StrCat("its spec has ", stages, " stages"));
  // Bounded before the slots are listed: every stage has a placement, at most kMaxReplicas each.
  if (stages > job.stages_size()) {
    return absl::DataLossError(absl::StrCat("its spec has ", stages, " stages but it has ", job.stages_size(),
                                            " placements"));
  }
  const v1::JobSpec& spec = job.spec();
  if (spec.stage_replicas_size() > 0 && spec.stage_replicas_size() != stages) {
    return absl::DataLossError(absl::StrCat("its spec lists ", spec.stage_replicas_size(), " replica counts for ",
                                            stages, " stages"));
  }
  for (int s = 0; s < stages; ++s) {
    const int n = spec.stage_replicas_size() > 0 ? spec.stage_replicas(s) : std::max(1, spec.replicas());
    if (n < 1 || n > kMaxReplicas) return absl::DataLossError(absl::StrCat("its spec has ", n, " replicas of stage ", s));
  }
  const std::vector<ReplicaSlot> slots = ReplicaSlots(spec);
  if (slots.size() != static_cast<size_t>(job.stages_size())) {
    return absl::DataLossError(absl::StrCat("its spec asks for ", WorkersNeeded(job.spec()), " workers (",
                                            DescribeStages(job.spec()), ") but it has ", job.stages_size(),
                                            " placements"));
  }
  for (int i = 0; i < job.stages_size(); ++i) {
    const v1::StagePlacement& p = job.stages(i);
    const ReplicaSlot& want = slots[static_cast<size_t>(i)];
    if (p.stage() != want.stage || p.replica() != want.replica) {
      return absl::DataLossError(absl::StrCat("placement ", i, " names stage ", p.stage(), " replica ", p.replica(),
                                              " (expected stage ", want.stage, " replica ", want.replica, ")"));
    }
  }
  if (job.state() == v1::JOB_STATE_RECOVERING && job.recoveries_size() == 0) {
    return absl::DataLossError("it is recovering but has no recovery record");
  }
  return absl::OkStatus();
}

void CoordinatorService::AfterRestart(Job& job) {
  const absl::Time now = opt_.clock->Now();
  job.attached.clear();
  job.ended.clear();
  job.finished.clear();
  if (job.status.state() == v1::JOB_STATE_RUNNING) {
    job.reattach_by = now + opt_.reattach_grace;
    ResetProgress(job);
  } else {
    // Which stages of the failed attempt had stopped was not persisted: each stage's worker reports
    // its end again when it comes back (or has become idle), or its stage is lost at stop_by.
    job.stopped.clear();
    job.lost.clear();
    job.stop_by = now + opt_.reattach_grace;
    job.recover_by = now + std::max(opt_.reattach_grace, absl::Seconds(job.status.spec().recovery().wait_seconds()));
  }
  Log(absl::StrCat("job ", job.status.job_id(), " was ", JobStateName(job.status.state()),
                   ": waiting up to ", absl::FormatDuration(opt_.reattach_grace), " for its workers to register again"));
}

void CoordinatorService::CheckDeadlines(Outbox* out) {
  const absl::Time now = opt_.clock->Now();
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job.status.state()) && now >= job.release_by) {
      // Stages told to stop when the job ended that have not reported their end: their workers
      // take no work until they do (a heartbeat with nothing running frees them as well).
      job.release_by = absl::InfiniteFuture();
      for (const v1::StagePlacement& p : job.status.stages()) {
        auto w = workers_.find(p.worker_id());
        if (w == workers_.end() || w->second.status.state() != v1::WORKER_STATE_BUSY || w->second.status.job_id() != id ||
            w->second.draining) {
          continue;
        }
        v1::RunningStage r;
        r.set_job_id(id);
        r.set_stage(p.stage());
        r.set_replica(p.replica());
        r.set_attempt(job.status.attempt());
        Drain(w->second, r, absl::StrCat("its stage of job ", id, " did not stop within ",
                                         absl::FormatDuration(opt_.stop_timeout), " of the job's end"));
      }
    } else if (job.status.state() == v1::JOB_STATE_RUNNING && now >= job.reattach_by) {
      job.reattach_by = absl::InfiniteFuture();
      std::vector<std::string> missing;
      for (const v1::StagePlacement& p : job.status.stages()) {
        const int slot = Slot(job, p.stage(), p.replica());
        if (!job.attached.count(slot) && !job.ended.count(slot)) missing.push_back(p.worker_name());
      }
      if (!missing.empty()) {
        BeginRecovery(job,
                      absl::StrCat("worker(s) ", absl::StrJoin(missing, ", "), " did not come back within ",
                                   absl::FormatDuration(opt_.reattach_grace), " of the coordinator's restart"),
                      nullptr, opt_.reattach_grace, out);
      }
    } else if (job.status.state() == v1::JOB_STATE_RECOVERING && now >= job.stop_by &&
               static_cast<int>(job.stopped.size()) < job.status.stages_size()) {
      for (const v1::StagePlacement& p : job.status.stages()) {
        if (job.stopped.count(Slot(job, p.stage(), p.replica()))) continue;
        const uint64_t wid = p.worker_id();
        auto w = workers_.find(wid);
        if (w != workers_.end() && w->second.status.state() != v1::WORKER_STATE_DEAD &&
            w->second.status.job_id() != id) {
          job.stopped.insert(Slot(job, p.stage(), p.replica()));  // not running the failed attempt
          if (w->second.status.state() == v1::WORKER_STATE_IDLE) {
            SetWorkerState(w->second, v1::WORKER_STATE_BUSY, id, "");  // came back idle: reserved
          } else {
            // Meanwhile given to another job: the stage needs a spare.
            job.lost.insert(Slot(job, p.stage(), p.replica()));
          }
          continue;
        }
        WorkerLost(wid, absl::StrCat("its stage of job ", id, " did not stop within ",
                                     absl::FormatDuration(opt_.stop_timeout), " of the recovery's start"),
                   out);
        job.lost.insert(Slot(job, p.stage(), p.replica()));
        job.stopped.insert(Slot(job, p.stage(), p.replica()));
      }
    }
  }
}

void CoordinatorService::ReleaseWorkers(Job& job) {
  const bool done = job.status.state() == v1::JOB_STATE_SUCCEEDED;
  for (const v1::StagePlacement& p : job.status.stages()) {
    auto it = workers_.find(p.worker_id());
    if (it == workers_.end() || it->second.status.state() != v1::WORKER_STATE_BUSY ||
        it->second.status.job_id() != job.status.job_id()) {
      continue;
    }
    // A stage still running reports its end later (OnFinished frees its worker then).
    const int slot = Slot(job, p.stage(), p.replica());
    if (done || job.ended.count(slot) || job.stopped.count(slot)) {
      SetWorkerState(it->second, v1::WORKER_STATE_IDLE, 0, "");
    }
  }
}

}  // namespace longhaul::coordinator
