#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/job_spec.h"
#include "stage_runtime/partition.h"

namespace longhaul::coordinator {
namespace {

void Log(const std::string& msg) { common::Log("coordinator", msg); }

std::string Describe(const v1::WorkerStatus& w) {
  return absl::StrCat("worker ", w.info().name(), " (id ", w.worker_id(), ", ", w.info().address(), ")");
}

// A duration to the millisecond, "0s" rather than absl's "0".
std::string Ms(absl::Duration d) {
  d = absl::Trunc(d, absl::Milliseconds(1));
  return d == absl::ZeroDuration() ? "0s" : absl::FormatDuration(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(std::unique_ptr<Store> store,
                                                                              CoordinatorOptions o) {
  std::unique_ptr<CoordinatorService> c(new CoordinatorService(std::move(store), o));
  absl::MutexLock l(&c->mu_);
  StoreTransaction txn(*c->store_);
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c->store_->LoadWorkers();
  if (!ws.ok()) return ws.status();
  for (v1::WorkerStatus& w : *ws) {
    c->next_worker_id_ = std::max(c->next_worker_id_, w.worker_id() + 1);
    if (w.state() != v1::WORKER_STATE_DEAD) {
      w.set_state(v1::WORKER_STATE_DEAD);
      w.set_job_id(0);
      w.set_note("coordinator restarted; waiting for the worker to register again");
      if (absl::Status s = c->store_->PutWorker(w); !s.ok()) return s;
    }
    c->workers_[w.worker_id()].status = std::move(w);
  }
  absl::StatusOr<std::vector<v1::LinkMeasurement>> links = c->store_->LoadLinks();
  if (!links.ok()) return links.status();
  for (v1::LinkMeasurement& m : *links) c->links_[{m.from_worker_id(), m.to_worker_id()}] = std::move(m);
  absl::StatusOr<std::vector<v1::JobStatus>> js = c->store_->LoadJobs();
  if (!js.ok()) return js.status();
  for (v1::JobStatus& j : *js) {
    c->next_job_id_ = std::max(c->next_job_id_, j.job_id() + 1);
    Job& job = c->jobs_[j.job_id()];
    job.status = std::move(j);
    if (job.status.state() == v1::JOB_STATE_RUNNING || job.status.state() == v1::JOB_STATE_RECOVERING) {
      if (absl::Status s = CheckResumable(job.status); !s.ok()) {
        Outbox none;
        c->FailJob(job, absl::StrCat("the state file's record of this job is damaged: ", s.message()),
                   v1::JOB_STATE_FAILED, &none);
      } else {
        c->AfterRestart(job);  // its workers come back (coordinator_recovery.cc)
      }
    } else if (job.status.state() == v1::JOB_STATE_PENDING) {
      job.queued_at = absl::UnixEpoch() + absl::Seconds(job.status.submitted_unix());
      c->queue_.insert(job.status.job_id());
    }
  }
  Log(absl::StrCat("loaded ", c->jobs_.size(), " job(s) and ", c->workers_.size(), " worker(s) from the state file; ",
                   c->queue_.size(), " pending"));
  Outbox none;  // no worker has a session yet
  c->Schedule(&none);
  return c;
}

CoordinatorService::~CoordinatorService() { Stop(); }

void CoordinatorService::StartMonitor() {
  monitor_ = std::thread([this] {
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200))) return;
      }
      CheckHeartbeats();
    }
  });
}

void CoordinatorService::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, w] : workers_) {
      if (w.session && w.session->ctx) w.session->ctx->TryCancel();
    }
  }
  if (monitor_.joinable()) monitor_.join();
}

void CoordinatorService::Persist(const Job& job) {
  if (absl::Status s = store_->PutJob(job.status); !s.ok()) Log(absl::StrCat("cannot persist job: ", s.message()));
}

void CoordinatorService::SetWorkerState(Worker& w, v1::WorkerState s, uint64_t job_id, const std::string& note) {
  w.draining.reset();  // Drain sets it after this
  w.status.set_state(s);
  w.status.set_job_id(job_id);
  w.status.set_note(note);
  w.status.set_last_heartbeat_unix(absl::ToDoubleSeconds(w.last_heartbeat - absl::UnixEpoch()));
  if (absl::Status st = store_->PutWorker(w.status); !st.ok()) Log(absl::StrCat("cannot persist worker: ", st.message()));
}

void CoordinatorService::Deliver(Outbox& out) {
  for (auto& [session, msg] : out) {
    if (!session) continue;  // a worker between its registration and its session
    absl::MutexLock l(&session->write_mu);
    if (session->stream) session->stream->Write(msg);
  }
  out.clear();
}

void CoordinatorService::Schedule(Outbox* out) {
  std::vector<uint64_t> idle;
  int live = 0;
  for (auto& [wid, w] : workers_) {
    live += w.status.state() != v1::WORKER_STATE_DEAD;
    if (w.status.state() == v1::WORKER_STATE_IDLE && w.session) idle.push_back(wid);
  }
  // Recovering jobs take the spares they need before any pending job starts.
  AdvanceRecoveries(&idle, out);
  if (queue_.empty()) return;
  std::vector<QueuedJob> queue;
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = jobs_.at(*it++);  // advanced first: FailJob erases the entry
    const v1::JobSpec& spec = job.status.spec();
    // Specs were validated at submission; this only guards against a state file from elsewhere.
    if (absl::Status s = stage_runtime::PartitionLayers(spec.model().layers(), spec.stages()).status(); !s.ok()) {
      FailJob(job, std::string(s.message()), v1::JOB_STATE_FAILED, out);
      continue;
    }
    queue.push_back({job.status.job_id(), WorkersNeeded(spec), job.queued_at});
  }
  const QueuePlan plan = PlanQueue(queue, idle, live, opt_.clock->Now(), opt_.queue);
  // PlanQueue decides which jobs start and counts their workers; the placement chooses which of
  // the idle workers each one takes (enough are left for every start).
  std::vector<uint64_t> free = idle;
  for (const QueuePlan::Start& s : plan.start) {
    Job& job = jobs_.at(s.job_id);
    Start(job, Place(job, &free), out);
  }
  for (const auto& [id, why] : plan.waiting) {
    Job& job = jobs_.at(id);
    if (job.status.pending_reason() == why) continue;
    job.status.set_pending_reason(why);
    Persist(job);
    Changed();
  }
}

void CoordinatorService::Start(Job& job, const std::vector<uint64_t>& worker_ids, Outbox* out) {
  const uint64_t id = job.status.job_id();
  const v1::JobSpec& spec = job.status.spec();
  // Checked by Schedule just before.
  const std::vector<stage_runtime::LayerRange> parts = *stage_runtime::PartitionLayers(spec.model().layers(), spec.stages());
  std::vector<Worker*> ws;
  for (uint64_t wid : worker_ids) ws.push_back(&workers_.at(wid));
  // The slots in proto/replica_layout.h's order (placement.h's; with one replica, the stages).
  const std::vector<ReplicaSlot> slots = ReplicaSlots(spec);
  const int n = static_cast<int>(slots.size());
  job.status.clear_stages();
  for (int i = 0; i < n; ++i) {
    const int s = slots[static_cast<size_t>(i)].stage;
    v1::StagePlacement* p = job.status.add_stages();
    p->set_stage(s);
    p->set_replica(slots[static_cast<size_t>(i)].replica);
    p->set_worker_id(ws[i]->status.worker_id());
    p->set_worker_name(ws[i]->status.info().name());
    p->set_layer_begin(parts[s].begin);
    p->set_layer_end(parts[s].end);
  }
  for (int i = 0; i < n; ++i) {
    v1::CoordinatorMessage m;
    FillAssignment(job, ws, i, m.mutable_assign());
    SetWorkerState(*ws[i], v1::WORKER_STATE_BUSY, id, "");
    out->emplace_back(ws[i]->session, std::move(m));
  }
  queue_.erase(id);
  job.ended.clear();
  job.finished.clear();
  job.status.clear_pending_reason();
  job.status.set_state(v1::JOB_STATE_RUNNING);
  job.status.set_started_unix(UnixNow());
  ResetProgress(job);
  Log(absl::StrCat("job ", id, " (", job.status.name(), ") placed on ", n, " worker(s) after waiting ",
                   Ms(opt_.clock->Now() - job.queued_at)));
  Persist(job);
  Changed();
}

void CoordinatorService::FillAssignment(const Job& job, const std::vector<Worker*>& ws, int slot,
                                        v1::StageAssignment* a) {
  const v1::JobSpec& spec = job.status.spec();
  const ReplicaSlot at = ReplicaSlots(spec)[static_cast<size_t>(slot)];
  const int S = spec.stages(), s = at.stage, r = at.replica;
  const v1::StagePlacement& p = job.status.stages(slot);
  auto peer = [&](int stage, int replica, v1::StagePeer* to) {
    const Worker* w = ws[static_cast<size_t>(SlotOf(spec, stage, replica))];
    to->set_worker_id(w->status.worker_id());
    to->set_name(w->status.info().name());
    to->set_address(w->status.info().address());
    to->set_region(w->status.info().region());  // links.between_regions_mbit, collectives
  };
  a->set_job_id(job.status.job_id());
  *a->mutable_spec() = spec;
  a->set_stage(s);
  a->set_layer_begin(p.layer_begin());
  a->set_layer_end(p.layer_end());
  // Replica r of stage s streams to the replicas of its neighbours whose share of the step overlaps
  // its own (with equal counts, replica r): prev and next are the first of them, the lists every
  // replica of the neighbouring stage (the worker picks: proto/replica_layout.h).
  for (const int n : {s - 1, s + 1}) {
    if (n < 0 || n >= S) continue;
    peer(n, ExchangingReplicas(spec, s, r, n).front(), n < s ? a->mutable_prev() : a->mutable_next());
    for (int q = 0; q < StageReplicas(spec, n); ++q) {
      peer(n, q, n < s ? a->add_prev_replicas() : a->add_next_replicas());
    }
  }
  a->set_attempt(job.status.attempt());
  // Each stage's checkpoints are copied to the next stage's worker (the last stage's to stage 0's)
  // of the same replica (of replica r mod N where the next stage has fewer); with one stage, to the
  // next replica's worker (the last replica's to replica 0's). The copy store names a copy by stage
  // and replica, so a sharded optimizer's checkpoints (each replica its own shard) are told apart.
  const int R = StageReplicas(spec, s);
  if (spec.checkpoint_replicate() == "peer") {
    if (S > 1) {
      const int to = (s + 1) % S;
      peer(to, r % StageReplicas(spec, to), a->mutable_replica());
    } else if (R > 1) {
      peer(s, (r + 1) % R, a->mutable_replica());
    }
  }
  if (R > 1) {
    a->set_replica_index(r);
    for (int q = 0; q < R; ++q) peer(s, q, a->add_replica_group());
  }
}

void CoordinatorService::FailJob(Job& job, const std::string& error, v1::JobState state, Outbox* out) {
  if (IsTerminal(job.status.state())) return;
  const bool was_running =
      job.status.state() == v1::JOB_STATE_RUNNING || job.status.state() == v1::JOB_STATE_RECOVERING;
  queue_.erase(job.status.job_id());
  job.status.clear_pending_reason();
  job.status.set_state(state);
  job.status.set_error(error);
  job.status.set_finished_unix(UnixNow());
  Log(absl::StrCat("job ", job.status.job_id(), " ", JobStateName(state), ": ", error));
  if (was_running) {
    for (const v1::StagePlacement& p : job.status.stages()) {
      auto it = workers_.find(p.worker_id());
      if (it == workers_.end() || !it->second.session || it->second.status.job_id() != job.status.job_id()) continue;
      v1::CoordinatorMessage m;
      m.mutable_cancel()->set_job_id(job.status.job_id());
      m.mutable_cancel()->set_reason(error);
      m.mutable_cancel()->set_attempt(job.status.attempt());
      out->emplace_back(it->second.session, std::move(m));
    }
    ReleaseWorkers(job);
    job.release_by = opt_.clock->Now() + opt_.stop_timeout;  // stages not stopped by then: drained
  }
  Persist(job);
  Changed();
}

void CoordinatorService::WorkerLost(uint64_t worker_id, const std::string& why, Outbox* out,
                                    absl::Duration detection) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.status.state() == v1::WORKER_STATE_DEAD) return;
  Worker& w = it->second;
  const uint64_t job_id = w.status.job_id();
  if (w.session && w.session->ctx) w.session->ctx->TryCancel();
  w.session.reset();
  Log(absl::StrCat(Describe(w.status), " lost: ", why));
  const absl::Duration silent = detection == absl::InfiniteDuration() ? opt_.clock->Now() - w.last_heartbeat : detection;
  const bool draining = w.draining.has_value();  // its stage is not the job's any more
  SetWorkerState(w, v1::WORKER_STATE_DEAD, 0, why);
  auto j = jobs_.find(job_id);
  // A coordinator shutting down leaves its jobs running: their workers come back to the next one.
  if (j != jobs_.end() && !IsTerminal(j->second.status.state()) && !stopping_ && !draining &&
      StageOf(j->second, worker_id) >= 0) {
    BeginRecovery(j->second, absl::StrCat(Describe(w.status), " lost: ", why), &w, silent, out);
  }
  SendProbePeers(out);  // the others stop probing it
  Changed();
}

void CoordinatorService::CheckHeartbeats() {
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    StoreTransaction txn(*store_);
    const absl::Time now = opt_.clock->Now();
    std::vector<uint64_t> late;
    for (auto& [id, w] : workers_) {
      if (w.status.state() != v1::WORKER_STATE_DEAD && now - w.last_heartbeat > opt_.heartbeat_timeout) {
        late.push_back(id);
      }
    }
    for (uint64_t id : late) {
      WorkerLost(id,
                 absl::StrCat("no heartbeat for ", Ms(now - workers_[id].last_heartbeat), " (timeout ",
                              Ms(opt_.heartbeat_timeout), ")"),
                 &out);
    }
    CheckDeadlines(&out);
    CheckProgress(&out);
    SendFloors(&out);
    Schedule(&out);
  }
  Deliver(out);
}

grpc::Status CoordinatorService::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                          v1::RegisterResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kWorker, &who, "Register"); !s.ok()) return s;
  // In-process callers (tests) have no context and no quota.
  if (ctx != nullptr) {
    if (absl::Status q = register_limiter_.Take(ctx->peer()); !q.ok()) return ToGrpc(q);
  }
  const v1::WorkerInfo& info = req->info();
  if (info.name().empty() || info.name().size() > 128) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker name must be 1..128 characters");
  }
  if (info.address().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker address is empty");
  // A worker registers under its certificate's name only: no one else can take its place.
  if (who.role == security::Role::kWorker && who.name != info.name()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("this certificate is worker ", who.name, "'s; it cannot register as ", info.name()));
  }
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    StoreTransaction txn(*store_);
    uint64_t id = 0;
    for (auto& [wid, w] : workers_) {
      if (w.status.info().name() != info.name()) continue;
      if (w.status.state() != v1::WORKER_STATE_DEAD) {
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            absl::StrCat("a live worker named ", info.name(), " is already registered (id ", wid, ")"));
      }
      id = wid;  // a dead worker coming back keeps its id
    }
    if (id == 0) id = next_worker_id_++;
    Worker& w = workers_[id];
    w.status.set_worker_id(id);
    *w.status.mutable_info() = info;
    w.last_heartbeat = opt_.clock->Now();
    w.session.reset();
    SetWorkerState(w, v1::WORKER_STATE_IDLE, 0, "");
    // After a coordinator restart, or after being declared dead: re-attached, or drained.
    if (req->has_running()) Reattach(w, req->running());
    resp->set_worker_id(id);
    resp->set_heartbeat_interval_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(opt_.heartbeat_interval)));
    resp->set_heartbeat_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(opt_.heartbeat_timeout)));
    Log(absl::StrCat("registered ", Describe(w.status), " region ", info.region(), " device ", info.device()));
    // It takes no stage before its session opens, but one more live worker changes what pending
    // jobs wait for (their reasons, which of them may become reservations).
    Schedule(&out);
  }
  Deliver(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Session(
    grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kWorker, &who, "Session"); !s.ok()) return s;
  v1::WorkerMessage m;
  if (!stream->Read(&m)) return grpc::Status::OK;
  const uint64_t id = m.worker_id();
  auto handle = std::make_shared<SessionHandle>();
  {
    absl::MutexLock hl(&handle->write_mu);
    handle->stream = stream;
  }
  handle->ctx = ctx;
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    StoreTransaction txn(*store_);
    auto it = workers_.find(id);
    if (stopping_ || it == workers_.end() || it->second.status.state() == v1::WORKER_STATE_DEAD) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("worker id ", id, " is not registered (register again)"));
    }
    // A session is bound to the certificate the worker registered with (taking over another
    // worker's id would lock it out and hand its stages to the caller).
    if (who.role == security::Role::kWorker && it->second.status.info().name() != who.name) {
      refusals_.Warn(absl::StrCat("Session ", who.name),
                     absl::StrCat("session for worker id ", id, " from ", ctx->peer(), " refused: certificate ",
                                  who.name, " is not worker ", it->second.status.info().name()));
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("worker id ", id, " belongs to ", it->second.status.info().name(),
                                       ", not to this certificate's ", who.name));
    }
    if (it->second.session && it->second.session->ctx) it->second.session->ctx->TryCancel();
    it->second.session = handle;
    it->second.last_heartbeat = opt_.clock->Now();
    SendProbePeers(&out);  // it measures its links to the others, and they theirs to it
    Schedule(&out);
  }
  Deliver(out);
  while (stream->Read(&m)) {
    {
      absl::MutexLock l(&mu_);
      auto it = workers_.find(id);
      if (it == workers_.end() || it->second.session != handle) break;  // superseded or declared dead
      Worker& w = it->second;
      w.last_heartbeat = opt_.clock->Now();
      if (m.has_heartbeat()) {
        StoreTransaction txn(*store_);  // (rarely) frees a worker and schedules
        CheckRunning(w, m.heartbeat(), &out);
      } else if (m.has_progress()) {
        StoreTransaction txn(*store_);
        OnProgress(w, m.progress());
      } else if (m.has_finished()) {
        StoreTransaction txn(*store_);
        OnFinished(w, CheckFinishedStep(w, m.finished()), &out);
      } else if (m.has_link()) {
        StoreTransaction txn(*store_);
        OnLinkReport(w, m.link());
      } else if (m.has_replicated()) {
        StoreTransaction txn(*store_);
        OnReplicated(w, m.replicated());
      }
    }
    Deliver(out);
  }
  {
    absl::MutexLock l(&mu_);
    StoreTransaction txn(*store_);
    auto it = workers_.find(id);
    if (it != workers_.end() && it->second.session == handle) {
      const std::string since = Ms(opt_.clock->Now() - it->second.last_heartbeat);
      WorkerLost(id,
                 stopping_ ? "coordinator shutting down"
                           : absl::StrCat("session closed (the worker exited or lost its connection); last heartbeat ",
                                          since, " before"),
                 &out);
      if (!stopping_) Schedule(&out);
    }
  }
  {
    absl::MutexLock hl(&handle->write_mu);
    handle->stream = nullptr;
  }
  Deliver(out);
  return grpc::Status::OK;
}

void CoordinatorService::OnProgress(Worker& w, const v1::StepProgress& p) {
  auto it = jobs_.find(p.job_id());
  if (it == jobs_.end() || it->second.status.state() != v1::JOB_STATE_RUNNING) return;
  Job& job = it->second;
  const int S = job.status.spec().stages();
  // Replicated stages (slots: proto/replica_layout.h): the loss (the mean over the last stage's
  // replicas, which every one of them knows) is taken from replica 0.
  const int slot = Slot(job, p.stage(), p.replica());
  if (slot < 0 || job.status.stages(slot).worker_id() != w.status.worker_id()) {
    return;
  }
  if (p.attempt() != job.status.attempt()) return;  // a stage of a failed attempt, still winding down
  const bool reports_loss = p.stage() == S - 1 && p.replica() == 0;
  if (p.step() <= job.status.stages(slot).step()) {
    // Sent again after the coordinator went away (worker.h): only a loss that may be missing.
    if (reports_loss) (void)store_->AppendLoss(job.status.job_id(), p.step(), p.loss());
    return;
  }
  job.latest[slot] = p;
  TrackCheckpoints(job, p);
  TrackStep(job, p);
  job.status.mutable_stages(slot)->set_step(p.step());
  if (p.has_dp_sync()) *job.status.mutable_stages(slot)->mutable_dp_sync() = p.dp_sync();
  int64_t wire = 0, raw = 0, dp = 0, dp_raw = 0, dp_busiest = 0;
  double err = 0, dp_seconds = 0;
  int err_n = 0;
  for (const auto& [s, lp] : job.latest) {
    wire += lp.wire_bytes();
    raw += lp.raw_bytes();
    dp += lp.dp_bytes();
    dp_raw += lp.dp_raw_bytes();
    dp_seconds = std::max(dp_seconds, lp.dp_seconds());
    dp_busiest = std::max(dp_busiest, lp.dp_sync().busiest_link_bytes());
    if (lp.stage() < S - 1) {
      err += lp.mean_rel_error();
      ++err_n;
    }
  }
  job.status.set_wire_bytes(wire);
  job.status.set_raw_bytes(raw);
  job.status.set_mean_rel_error(err_n ? err / err_n : 0.0);
  if (HasReplicas(job.status.spec())) {
    job.status.set_dp_bytes_per_step(dp);
    job.status.set_dp_raw_bytes_per_step(dp_raw);
    job.status.set_dp_seconds(dp_seconds);
    job.status.set_dp_busiest_link_bytes(dp_busiest);
  }
  if (reports_loss) {
    const absl::Time now = opt_.clock->Now();
    if (job.status.step() == 0) {
      job.status.set_initial_loss(p.loss());
      job.first_step_at = now;
      job.first_step_tokens = p.step() * p.tokens();
      job.status.set_tokens_per_s(p.step_seconds() > 0 ? p.tokens() / p.step_seconds() : 0.0);
    } else {
      // Steady state: tokens since the first step over the time since then, start-up and the last
      // stage's checkpoint writes excluded (the other stages write theirs at the same steps).
      job.checkpoint_seconds += p.checkpoint_seconds();
      const double training = absl::ToDoubleSeconds(now - job.first_step_at) - job.checkpoint_seconds;
      if (training > 0) {
        job.status.set_tokens_per_s(static_cast<double>(p.step() * p.tokens() - job.first_step_tokens) / training);
      }
    }
    job.status.set_step(p.step());
    job.status.set_loss(p.loss());
    if (absl::Status s = store_->AppendLoss(job.status.job_id(), p.step(), p.loss()); !s.ok()) {
      Log(absl::StrCat("cannot persist loss: ", s.message()));
    }
    Persist(job);
  }
  Changed();
}

v1::JobFinished CoordinatorService::CheckFinishedStep(const Worker& w, v1::JobFinished f) {
  if (!f.ok()) return f;
  auto it = jobs_.find(f.job_id());
  if (it == jobs_.end() || it->second.status.state() != v1::JOB_STATE_RUNNING ||
      f.attempt() != it->second.status.attempt()) {
    return f;  // OnFinished ignores it, or only frees the worker
  }
  const Job& job = it->second;
  const int slot = Slot(job, f.stage(), f.replica());
  if (slot < 0 || job.status.stages(slot).worker_id() != w.status.worker_id()) {
    return f;  // not this worker's stage: OnFinished does not count it
  }
  const int64_t reached = job.status.stages(slot).step(), planned = job.status.spec().steps();
  if (reached >= planned) return f;
  Log(absl::StrCat(Describe(w.status), " reported job ", f.job_id(), " stage ", f.stage(), " finished at step ",
                   reached, " of ", planned, ": taken as a failure"));
  f.set_ok(false);
  f.set_retryable(false);
  f.set_error(absl::StrCat("stage ", f.stage(), " reported finished at step ", reached, " of ", planned));
  return f;
}

}  // namespace longhaul::coordinator
