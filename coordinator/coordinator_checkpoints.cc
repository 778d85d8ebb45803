// Checkpoint bookkeeping of running jobs (coordinator.h, docs/recovery.md): which steps each stage
// holds on its own disk (progress reports) and where its copies are (replication reports), and the
// checkpoint floor below which the workers may delete.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "coordinator/coordinator.h"

namespace longhaul::coordinator {
namespace {

// Checkpoint steps remembered per stage (the workers keep as many: worker/checkpoint_store.h).
constexpr int kKeepCheckpoints = 4;

void Log(const std::string& msg) { common::Log("coordinator", msg); }

// Keeps the newest kKeepCheckpoints distinct steps of `steps` (sorted ascending).
void KeepNewest(std::vector<int64_t>* steps) {
  std::sort(steps->begin(), steps->end());
  steps->erase(std::unique(steps->begin(), steps->end()), steps->end());
  if (steps->size() > kKeepCheckpoints) steps->erase(steps->begin(), steps->end() - kKeepCheckpoints);
}

}  // namespace

void CoordinatorService::SetLocalCheckpoints(v1::StagePlacement* p, std::vector<int64_t> steps) {
  KeepNewest(&steps);
  p->clear_local_checkpoints();
  for (int64_t s : steps) p->add_local_checkpoints(s);
}

void CoordinatorService::TrackCheckpoints(Job& job, const v1::StepProgress& p) {
  const int slot = Slot(job, p.stage(), p.replica());
  v1::StagePlacement* sp = job.status.mutable_stages(slot);
  bool changed = false;
  if (p.checkpointed()) {
    std::vector<int64_t> local(sp->local_checkpoints().begin(), sp->local_checkpoints().end());
    local.push_back(p.step());
    SetLocalCheckpoints(sp, local);
    changed = true;
  }
  // The step counts once the last stage's replica 0 (the one that reports the loss) completed it.
  if (p.stage() == job.status.spec().stages() - 1 && p.replica() == 0 && job.status.recoveries_size() > 0) {
    v1::Recovery* r = job.status.mutable_recoveries(job.status.recoveries_size() - 1);
    if (r->resumed_unix() > 0 && r->recovered_unix() == 0 && p.step() > r->restored_step()) {
      r->set_recovered_unix(UnixNow());
      r->set_recovery_seconds(r->recovered_unix() - r->failed_unix());
      Log(absl::StrCat("job ", job.status.job_id(), " recovered: step ", p.step(), " completed ",
                       absl::StrFormat("%.3f", r->recovery_seconds()), " s after the failure"));
      changed = true;
    }
  }
  if (changed) Persist(job);
}

void CoordinatorService::OnReplicated(Worker& w, const v1::CheckpointReplicated& r) {
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end() || IsTerminal(it->second.status.state())) return;
  Job& job = it->second;
  // Only the current attempt's copies count (a late report of a failed attempt would mix restore
  // points), and only onto a live worker.
  const int slot = Slot(job, r.stage(), r.replica());
  if (slot < 0 || job.status.stages(slot).worker_id() != w.status.worker_id() || r.attempt() != job.status.attempt() ||
      job.status.state() != v1::JOB_STATE_RUNNING) {
    return;
  }
  auto to = workers_.find(r.replica_worker_id());
  if (to == workers_.end() || to->second.status.state() == v1::WORKER_STATE_DEAD) return;
  if (!r.error().empty()) {
    Log(absl::StrCat("job ", r.job_id(), " ", SlotName(job.status, slot), " step ", r.step(), ": ", r.error()));
    return;
  }
  v1::StagePlacement* sp = job.status.mutable_stages(slot);
  std::vector<int64_t> steps;
  google::protobuf::RepeatedPtrField<v1::CheckpointReplica> keep;
  for (const v1::CheckpointReplica& c : sp->replicas()) {
    if (c.step() == r.step() && c.worker_id() == r.replica_worker_id()) continue;
    steps.push_back(c.step());
    *keep.Add() = c;
  }
  steps.push_back(r.step());
  KeepNewest(&steps);
  v1::CheckpointReplica* added = keep.Add();
  added->set_step(r.step());
  added->set_worker_id(r.replica_worker_id());
  sp->clear_replicas();
  for (const v1::CheckpointReplica& c : keep) {
    if (std::binary_search(steps.begin(), steps.end(), c.step())) *sp->add_replicas() = c;
  }
  Persist(job);
}

void CoordinatorService::SendFloors(Outbox* out) {
  for (auto& [id, job] : jobs_) {
    if (job.status.state() != v1::JOB_STATE_RUNNING) continue;
    const int S = job.status.stages_size();
    const bool peer = job.status.spec().checkpoint_replicate() == "peer" && S > 1;
    // The newest step every stage can be restored from with its worker's disk gone (replicated),
    // or, without replication, from its worker's disk.
    std::map<int64_t, int> count;
    for (const v1::StagePlacement& p : job.status.stages()) {
      std::vector<int64_t> steps;
      if (peer) {
        for (const v1::CheckpointReplica& c : p.replicas()) steps.push_back(c.step());
      } else {
        steps.assign(p.local_checkpoints().begin(), p.local_checkpoints().end());
      }
      std::sort(steps.begin(), steps.end());
      steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
      for (int64_t s : steps) ++count[s];
    }
    int64_t floor = 0;
    for (const auto& [step, n] : count) {
      if (n == S) floor = step;
    }
    if (floor <= job.floor) continue;
    job.floor = floor;
    for (int s = 0; s < S; ++s) {
      v1::StagePlacement* p = job.status.mutable_stages(s);
      std::vector<int64_t> local;
      for (int64_t step : p->local_checkpoints()) {
        if (step >= floor) local.push_back(step);
      }
      SetLocalCheckpoints(p, local);
      google::protobuf::RepeatedPtrField<v1::CheckpointReplica> keep;
      for (const v1::CheckpointReplica& c : p->replicas()) {
        if (c.step() >= floor) *keep.Add() = c;
      }
      p->mutable_replicas()->Swap(&keep);
      auto w = workers_.find(p->worker_id());
      if (w == workers_.end() || !w->second.session) continue;
      v1::CoordinatorMessage m;
      m.mutable_checkpoint_floor()->set_job_id(id);
      m.mutable_checkpoint_floor()->set_step(floor);
      out->emplace_back(w->second.session, std::move(m));
    }
    Persist(job);
  }
}

}  // namespace longhaul::coordinator
