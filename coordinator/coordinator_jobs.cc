// The coordinator's job and worker queries and commands from clients (longhaulctl): submit,
// get, list, watch and cancel jobs, list workers. The workers' side is in coordinator.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_spec.h"

namespace longhaul::coordinator {
namespace {

void Log(const std::string& msg) { common::Log("coordinator", msg); }

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                           v1::SubmitJobResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kAdmin, &who, "SubmitJob"); !s.ok()) return s;
  if (ctx != nullptr) {  // in-process callers (tests) have no quota
    if (absl::Status q = submit_limiter_.Take(ctx->peer()); !q.ok()) return ToGrpc(q);
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(req->spec_yaml(), req->steps_override());
  if (!spec.ok()) return ToGrpc(spec.status());
  // A model no worker can hold would only fail on every worker it is given, after the queue.
  if (const MemoryEstimate e = EstimateStageMemory(*spec);
      opt_.worker_memory_bytes > 0 && e.total_bytes() > static_cast<double>(opt_.worker_memory_bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the model does not fit a worker: ", e.ToString(spec->stages()),
                                     " needed at least, a worker has ", opt_.worker_memory_bytes >> 20,
                                     " MiB (use more stages or a smaller model)"));
  }
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    // A replicated job the cluster cannot host is refused now rather than queued (a one-replica job
    // with more stages than workers still waits for them to register: scheduler.h).
    if (HasReplicas(*spec)) {
      int live = 0, idle = 0;
      for (const auto& [wid, w] : workers_) {
        live += w.status.state() != v1::WORKER_STATE_DEAD;
        idle += w.status.state() == v1::WORKER_STATE_IDLE;
      }
      if (WorkersNeeded(*spec) > live) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("needs ", WorkersNeeded(*spec), " workers (", DescribeStages(*spec),
                                         "), ", idle, " are idle, ", live, " registered"));
      }
    }
    StoreTransaction txn(*store_);
    const uint64_t id = next_job_id_++;
    Job& job = jobs_[id];
    job.status.set_job_id(id);
    job.status.set_name(spec->name());
    job.status.set_state(v1::JOB_STATE_PENDING);
    job.status.set_steps(spec->steps());
    job.status.set_submitted_unix(UnixNow());
    *job.status.mutable_spec() = *spec;
    job.status.set_spec_yaml(req->spec_yaml());
    job.queued_at = opt_.clock->Now();
    queue_.insert(id);
    Persist(job);
    Changed();
    Log(absl::StrCat("job ", id, " (", spec->name(), ") submitted: ", DescribeStages(*spec), ", ", spec->steps(),
                     " steps"));
    resp->set_job_id(id);
    Schedule(&out);
  }
  Deliver(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::JobStatus* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "GetJob"); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(req->job_id());
  if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no job ", req->job_id()));
  *resp = it->second.status;
  if (req->include_losses()) {
    absl::StatusOr<std::vector<double>> losses = store_->Losses(req->job_id());
    if (!losses.ok()) return ToGrpc(losses.status());
    for (double v : *losses) resp->add_losses(v);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*, v1::ListJobsResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "ListJobs"); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  for (const auto& [id, job] : jobs_) {
    v1::JobStatus* s = resp->add_jobs();
    *s = job.status;
    s->clear_spec_yaml();
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                          grpc::ServerWriter<v1::JobStatus>* writer) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "WatchJob"); !s.ok()) return s;
  uint64_t seen = ~uint64_t{0};
  for (;;) {
    v1::JobStatus st;
    {
      absl::MutexLock l(&mu_);
      auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return version_ != seen || stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Seconds(1));
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      auto it = jobs_.find(req->job_id());
      if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no job ", req->job_id()));
      if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
      if (version_ == seen) continue;
      seen = version_;
      st = it->second.status;
      st.clear_spec_yaml();
    }
    if (!writer->Write(st)) return grpc::Status::CANCELLED;
    if (IsTerminal(st.state())) return grpc::Status::OK;
  }
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::CancelJobResponse*) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kAdmin, &who, "CancelJob"); !s.ok()) return s;
  Outbox out;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no job ", req->job_id()));
    if (IsTerminal(it->second.status.state())) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", req->job_id(), " already ", JobStateName(it->second.status.state())));
    }
    StoreTransaction txn(*store_);
    FailJob(it->second, "cancelled by the user", v1::JOB_STATE_CANCELLED, &out);
    // A cancelled pending job leaves the queue (FailJob): the jobs it held back may start now. A
    // running one frees its workers when they report the end (OnFinished schedules then).
    Schedule(&out);
  }
  Deliver(out);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                             v1::ListWorkersResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "ListWorkers"); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  for (auto& [id, w] : workers_) {
    v1::WorkerStatus* s = resp->add_workers();
    *s = w.status;
    if (w.status.state() != v1::WORKER_STATE_DEAD) {
      s->set_last_heartbeat_unix(absl::ToDoubleSeconds(w.last_heartbeat - absl::UnixEpoch()));
    }
  }
  return grpc::Status::OK;
}

}  // namespace longhaul::coordinator
