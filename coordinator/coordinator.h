// The coordinator: worker registry with heartbeats, job admission, placement, progress tracking,
// failure detection — all persisted in a Store — behind the Coordinator gRPC service.
//
//   absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(path);   // locks the state file
//   CoordinatorOptions o;
//   o.heartbeat_timeout = absl::Seconds(3);
//   absl::StatusOr<std::unique_ptr<CoordinatorService>> svc = CoordinatorService::Create(std::move(*store), o);
//   builder.RegisterService(svc->get());  ...  (*svc)->StartMonitor();
//
// Scheduling: pending jobs form a queue in submission order, and every state change re-runs it —
// a job submitted or cancelled (a cancelled pending job leaves the queue), a job's worker
// reporting its end or failure, a worker registering, opening its session or dying, and every
// monitor tick (so a job that has waited long enough becomes a reservation). The rule is
// PlanQueue's (scheduler.h): a job starts if enough idle workers are left for it, otherwise it is
// skipped and later jobs may still start; a job that has waited `queue.reserve_after` (default
// 10 min) and would fit on the live workers holds back every job behind it until it starts, so
// small jobs cannot starve a big one; a job with more stages than there are live workers holds
// back nothing. A pending job's JobStatus.pending_reason says why it waits.
//
// Placement today is simple: a starting job takes the lowest-numbered idle workers, stage i on the
// i-th of them (the placement issue makes it bandwidth-aware). A job fails, naming the worker, when
// one of its workers dies (session closed or no heartbeat for heartbeat_timeout; the error says
// how long since its last heartbeat) or reports an error; the other workers are told to cancel and
// become idle again (recovery is a later issue). Workers send heartbeats at the interval the
// coordinator gives them at registration (RegisterResponse.heartbeat_interval_ms).
//
// Threading: all state is guarded by mu_ (Store calls included). gRPC sync-server threads run the
// handlers; Session handlers live as long as their worker's stream. Writes to a worker's stream go
// through its Session's own write mutex and are never made while holding mu_. The monitor thread
// checks heartbeats against the injected Clock and re-runs scheduling. Each handler's writes to
// the Store form one transaction.
#ifndef LONGHAUL_COORDINATOR_COORDINATOR_H_
#define LONGHAUL_COORDINATOR_COORDINATOR_H_

#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/scheduler.h"
#include "coordinator/states.h"  // JobStateName, WorkerStateName, IsTerminal
#include "coordinator/store.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "common/clock.h"

namespace longhaul::coordinator {

struct CoordinatorOptions {
  // Workers send a heartbeat every interval; one silent for longer than the timeout is dead.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  QueueOptions queue;  // when a waiting job becomes a reservation
  common::Clock* clock = common::RealClock();
};

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // Loads persisted state: jobs that were running when the previous coordinator stopped are marked
  // failed (their workers are told to cancel when they reconnect); all workers start as dead until
  // they register again.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(std::unique_ptr<Store> store,
                                                                    CoordinatorOptions o);
  ~CoordinatorService() override;

  void StartMonitor();
  // Ends every session (so the server can shut down) and stops the monitor.
  void Stop();
  // Marks workers whose last heartbeat is older than the timeout as dead, then re-runs scheduling
  // (time alone can turn a waiting job into a reservation). Called by the monitor; public for
  // tests with a fake clock.
  void CheckHeartbeats();

  // What the metrics export (coordinator_metrics.h) reads at each scrape: copies taken under mu_.
  struct MetricsView {
    // Every pending or running job and the `max_jobs` most recent (highest ids), by id; no spec_yaml.
    std::vector<v1::JobStatus> jobs;
    struct WorkerView {
      v1::WorkerStatus status;
      double heartbeat_age_seconds = 0;  // since its last heartbeat (0 for a dead worker)
    };
    std::vector<WorkerView> workers;  // every worker known, dead ones included
  };
  MetricsView ViewForMetrics(size_t max_jobs);

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse*) override;
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*) override;
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*, grpc::ServerWriter<v1::JobStatus>*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*, v1::ListWorkersResponse*) override;

 private:
  // One worker's open session stream.
  struct SessionHandle {
    absl::Mutex write_mu;
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream ABSL_GUARDED_BY(write_mu);
    grpc::ServerContext* ctx = nullptr;
  };
  struct Worker {
    v1::WorkerStatus status;
    absl::Time last_heartbeat;
    std::shared_ptr<SessionHandle> session;  // null until Session opens, and after it closes
  };
  struct Job {
    v1::JobStatus status;
    std::map<int, v1::StepProgress> latest;  // per stage
    std::map<int, bool> finished;            // stages that reported JobFinished ok
    absl::Time first_step_at;                // wall time of the first completed step (last stage)
    int64_t first_step_tokens = 0;
    absl::Time queued_at;                    // when it was submitted (for reservations)
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<SessionHandle>, v1::CoordinatorMessage>>;

  CoordinatorService(std::unique_ptr<Store> store, CoordinatorOptions o) : store_(std::move(store)), opt_(o) {}
  // Runs the queue (scheduler.h) and applies the plan: starts jobs, updates waiting reasons.
  void Schedule(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Start(Job& job, const std::vector<uint64_t>& worker_ids, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJob(Job& job, const std::string& error, v1::JobState state, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLost(uint64_t worker_id, const std::string& why, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnProgress(Worker& w, const v1::StepProgress& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinished(Worker& w, const v1::JobFinished& f, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetWorkerState(Worker& w, v1::WorkerState s, uint64_t job_id, const std::string& note)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }
  static void Deliver(Outbox& out);
  double UnixNow() { return absl::ToDoubleSeconds(opt_.clock->Now() - absl::UnixEpoch()); }

  std::unique_ptr<Store> store_;
  const CoordinatorOptions opt_;
  absl::Mutex mu_;
  std::map<uint64_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // pending jobs; ids grow, so in submission order
  uint64_t next_worker_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_job_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumped on every job change (WatchJob waits on it)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_COORDINATOR_H_
