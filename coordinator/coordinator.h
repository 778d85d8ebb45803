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
// Placement (coordinator_placement.cc, the model and solvers in placement.h): a starting job's
// stages go where the cost model predicts the shortest step, chosen among the idle workers from the
// link matrix the workers report (each measures its links to the others, worker/link_prober.h) and
// their compute speeds; with a link among them unmeasured, or no placement predicted at least
// `placement.min_gain` faster, it takes the lowest-numbered idle workers in order (the naive
// order). JobStatus.placement says which and why. Workers send heartbeats at the interval the
// coordinator gives them at registration (RegisterResponse.heartbeat_interval_ms).
//
// Recovery (coordinator_recovery.cc, docs/recovery.md): when a worker of a running job dies
// (session closed, or no heartbeat for heartbeat_timeout) or a stage stops with a retryable error,
// the job goes RECOVERING: the other stages are cancelled, and once all have stopped the dead
// stages get spare workers (idle ones, before any pending job; or ones that register within the
// spec's recovery.wait), and every stage restarts — a new attempt — from the newest checkpoint step
// that every stage can be restored from (its own worker's disk, or the copy on its replica
// worker). recovery.max_restarts bounds the restarts; a stage's own error (not retryable) fails the
// job at once. The coordinator also tells the workers the job's checkpoint floor, below which
// they may delete checkpoints. After a coordinator restart, running jobs keep running: their
// workers register again naming their stage and are re-attached; a stage whose worker has not
// come back within reattach_grace is recovered like a dead one.
//
// Hung stages and stragglers (coordinator_watchdog.cc, docs/recovery.md): a running job that
// reports no step for a multiple of its expected step time (the spec's recovery.progress_timeout_*)
// has a hung stage — the one computing while its neighbours wait for it, by the activity its
// worker's heartbeats report — whose worker is treated as lost. A stage whose compute per step is
// a multiple of its prediction is flagged as a straggler (StagePlacement.straggler).
//
// A worker still running a stage the coordinator no longer wants there (moved to another worker
// while it was away, or of a job that has ended) is kept BUSY — given no work — and told to stop
// at each heartbeat until it reports the stage's end or a heartbeat with nothing running.
//
// Threading: all state is guarded by mu_ (Store calls included). gRPC sync-server threads run the
// handlers; Session handlers live as long as their worker's stream. Writes to a worker's stream go
// through its Session's own write mutex and are never made while holding mu_. The monitor thread
// checks heartbeats against the injected Clock and re-runs scheduling. Each handler's writes to
// the Store form one transaction.
#ifndef LONGHAUL_COORDINATOR_COORDINATOR_H_
#define LONGHAUL_COORDINATOR_COORDINATOR_H_

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/placement.h"
#include "coordinator/scheduler.h"
#include "coordinator/states.h"  // JobStateName, WorkerStateName, IsTerminal
#include "coordinator/store.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "proto/grpc_status.h"
#include "proto/replica_layout.h"
#include "common/clock.h"
#include "security/pki.h"

namespace longhaul::coordinator {

struct CoordinatorOptions {
  // Workers send a heartbeat every interval; one silent for longer than the timeout is dead.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  QueueOptions queue;  // when a waiting job becomes a reservation
  // After a restart, how long a running job's workers have to register again before their stages
  // are recovered elsewhere (workers retry every few seconds).
  absl::Duration reattach_grace = absl::Seconds(30);
  // A recovering job's stages are cancelled; one whose worker has not reported its end after this
  // long is treated as lost (a hung stage).
  absl::Duration stop_timeout = absl::Seconds(30);
  struct Placement {
    // The bandwidth-aware placement is used only when predicted at least this much faster than the
    // naive order (measurements are noisy; a marginal gain is not worth an unpredictable order).
    double min_gain = 0.05;
    // The scheduler solves under mu_: the heuristic for large clusters gets a short time limit.
    placement::SolveOptions solve = {.exact_limit = 100000, .rounds = 200, .time_limit = absl::Milliseconds(500)};
  } placement;
  common::Clock* clock = common::RealClock();
  // The cluster CA (docs/security.md; coordinator_auth.cc): set, every RPC but Join needs a client
  // certificate of a role allowed to make it, Join signs certificates for join tokens, and a
  // worker's session is bound to its certificate's name. Null (--insecure): no checks, no Join.
  const security::CertificateAuthority* ca = nullptr;
  // Per-client quotas on submissions and registrations (scheduler.h, docs/security.md).
  AdmissionLimits limits;
  // The memory of one worker, which a submitted job's largest stage must fit (EstimateStageMemory,
  // job_spec.h) or it is refused with the estimate; 0: no check. Workers do not report their
  // memory yet: the default is one 80 GiB accelerator's, the largest commonly rented.
  int64_t worker_memory_bytes = int64_t{80} << 30;
};

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // Loads persisted state: all workers start as dead until they register again; jobs that were
  // running (or recovering) when the previous coordinator stopped wait reattach_grace for their
  // workers to come back (see the top of this file).
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(std::unique_ptr<Store> store,
                                                                    CoordinatorOptions o);
  ~CoordinatorService() override;

  void StartMonitor();
  // Ends every session (so the server can shut down) and stops the monitor.
  void Stop();
  // Marks workers whose last heartbeat is older than the timeout as dead, advances recoveries whose
  // deadlines passed, sends checkpoint floors, then re-runs scheduling (time alone can turn a
  // waiting job into a reservation). Called by the monitor; public for tests with a fake clock.
  void CheckHeartbeats();

  // What the metrics export (coordinator_metrics.h) reads at each scrape: copies taken under mu_.
  struct MetricsView {
    // Every pending, running or recovering job and the `max_jobs` most recent (highest ids), by id;
    // no spec_yaml.
    std::vector<v1::JobStatus> jobs;
    struct WorkerView {
      v1::WorkerStatus status;
      double heartbeat_age_seconds = 0;  // since its last heartbeat (0 for a dead worker)
    };
    std::vector<WorkerView> workers;  // every worker known, dead ones included
  };
  MetricsView ViewForMetrics(size_t max_jobs);

  // Identity (coordinator_auth.cc, docs/security.md).
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest*, v1::JoinResponse*) override;
  grpc::Status Renew(grpc::ServerContext*, const v1::RenewRequest*, v1::JoinResponse*) override;
  grpc::Status CreateToken(grpc::ServerContext*, const v1::CreateTokenRequest*, v1::CreateTokenResponse*) override;
  grpc::Status CreateIdentity(grpc::ServerContext*, const v1::CreateIdentityRequest*,
                              v1::CreateIdentityResponse*) override;
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse*) override;
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*) override;
  // The clients' job and worker RPCs (coordinator_jobs.cc).
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*, grpc::ServerWriter<v1::JobStatus>*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*, v1::ListWorkersResponse*) override;
  grpc::Status ListLinks(grpc::ServerContext*, const v1::ListLinksRequest*, v1::ListLinksResponse*) override;
  grpc::Status PlanJob(grpc::ServerContext*, const v1::PlanJobRequest*, v1::PlanJobResponse*) override;

 private:
  // What an RPC needs of its caller's certificate (coordinator_auth.cc).
  enum class Access { kWorker, kRead, kAdmin };
  // OK when the caller may make the RPC (always without a CA); `who` gets its identity (without a
  // CA: no name, role admin). The refusal says what was missing and is logged with the peer.
  grpc::Status Authorize(grpc::ServerContext* ctx, Access need, security::Identity* who, const char* rpc);
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
    // A stage it runs that the coordinator does not want there (see the top of this file): BUSY,
    // given no work, until that stage ends.
    std::optional<v1::RunningStage> draining;
  };
  struct Job {
    v1::JobStatus status;
    std::map<int, v1::StepProgress> latest;  // per stage
    std::map<int, bool> finished;            // stages that reported JobFinished ok
    absl::Time first_step_at;                // wall time of the first completed step (last stage)
    int64_t first_step_tokens = 0;
    double checkpoint_seconds = 0;           // the last stage's checkpoint writes since then
    absl::Time queued_at;                    // when it was submitted (for reservations)
    // Recovery (coordinator_recovery.cc), for the current attempt.
    std::set<int> ended;     // stages whose worker reported the attempt's end (ok or not)
    std::set<int> stopped;   // RECOVERING: stages of the failed attempt known to have stopped
    std::set<int> lost;      // RECOVERING: stages whose worker is gone (they need another)
    absl::Time stop_by;      // RECOVERING: stages not stopped by then are treated as lost
    absl::Time recover_by;   // RECOVERING: fail if the lost stages have no workers by then
    absl::Time reattach_by = absl::InfiniteFuture();  // after a restart: unattached stages are lost then
    std::set<int> attached;  // after a restart: stages whose worker registered again
    int64_t floor = 0;       // the checkpoint floor last sent to the workers
    // Terminal: stages still running then get a note and their workers are drained.
    absl::Time release_by = absl::InfiniteFuture();
    // The progress watchdog and stragglers (coordinator_watchdog.cc), for the current attempt unless
    // said otherwise.
    absl::Time attempt_started;          // its assignments went out
    absl::Time last_step_at;             // a stage last reported a step (or its end)
    bool stepped = false;                // a step of this attempt was reported
    std::set<int> past_setup;            // stages seen stepping (activity or a step)
    absl::Time stepping_since = absl::InfiniteFuture();  // when the last of them was seen so
    std::map<int, v1::StageActivity> activity;  // per stage, from its worker's latest heartbeat
    std::deque<double> step_seconds;     // the last stage's recent step times (every attempt)
    double max_checkpoint_seconds = 0;   // the longest checkpoint write of any stage (every attempt)
    std::map<int, std::deque<double>> compute;  // per stage: recent compute seconds per step
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<SessionHandle>, v1::CoordinatorMessage>>;

  CoordinatorService(std::unique_ptr<Store> store, CoordinatorOptions o) : store_(std::move(store)), opt_(o) {}
  // Runs the queue (scheduler.h) and applies the plan: starts jobs, updates waiting reasons.
  void Schedule(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Start(Job& job, const std::vector<uint64_t>& worker_ids, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJob(Job& job, const std::string& error, v1::JobState state, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `detection`: how long the failure went unnoticed (infinite: since the worker's last heartbeat).
  void WorkerLost(uint64_t worker_id, const std::string& why, Outbox* out,
                  absl::Duration detection = absl::InfiniteDuration()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnProgress(Worker& w, const v1::StepProgress& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinished(Worker& w, const v1::JobFinished& f, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stage that reports "finished" must have reached the job's last step (its progress reports
  // say how far it got): an early "finished" becomes a failure of the stage, not a success.
  v1::JobFinished CheckFinishedStep(const Worker& w, v1::JobFinished f) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Recovery (coordinator_recovery.cc).
  // A stage of `job` failed (its worker `dead` gone, or null when it failed on a live worker):
  // RECOVERING, or FAILED when out of restarts. `detection`: how long the failure went unnoticed.
  void BeginRecovery(Job& job, const std::string& cause, const Worker* dead, absl::Duration detection, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves recovering jobs on (stages stopped, spares found: restart) and fails those out of time;
  // takes the spares they get out of `idle`.
  void AdvanceRecoveries(std::vector<uint64_t>* idle, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Resume(Job& job, const std::vector<uint64_t>& spares, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The assignment of `job`'s slot `slot` (replica slot / stages of stage slot % stages) placed on
  // `ws` (by slot): layers, neighbours (replica r of stage s streams to replica r of s + 1), the
  // checkpoint copy's holder, the replica group, the current attempt. Place and Resume add the rest.
  static void FillAssignment(const Job& job, const std::vector<Worker*>& ws, int slot, v1::StageAssignment* a);
  // The slot of `job` that `worker_id` runs (its index in JobStatus.stages: replica r's stage s at
  // r * stages + s, so the stage itself with one replica), or -1.
  int StageOf(const Job& job, uint64_t worker_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // OK when a running or recovering job read from the state file can be resumed: a placement per
  // slot naming that slot's stage and replica, a recovery record when recovering. A damaged or
  // hand-edited file can say anything; such a job fails with the reason at start-up.
  static absl::Status CheckResumable(const v1::JobStatus& job);
  // Replica `replica`'s stage `stage` as a slot, or -1 when either is outside the job (numbers from
  // a worker's report or a damaged state file: no overflow, no index past JobStatus.stages).
  static int Slot(const Job& job, int stage, int replica) {
    const int slot = SlotOf(job.status.spec(), stage, replica);
    return slot < job.status.stages_size() ? slot : -1;
  }
  // "stage s", or "stage s replica r" in a job with replicated stages.
  static std::string SlotName(const v1::JobStatus& job, int slot) {
    const std::vector<ReplicaSlot> slots = ReplicaSlots(job.spec());
    if (slot < 0 || slot >= static_cast<int>(slots.size())) return absl::StrCat("slot ", slot);
    const ReplicaSlot& at = slots[static_cast<size_t>(slot)];
    return HasReplicas(job.spec()) ? absl::StrCat("stage ", at.stage, " replica ", at.replica)
                                   : absl::StrCat("stage ", at.stage);
  }
  bool Alive(uint64_t worker_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Checkpoints and recovery progress from a step report of the current attempt.
  void TrackCheckpoints(Job& job, const v1::StepProgress& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The steps a stage holds on its worker's disk: the newest few of `steps`.
  static void SetLocalCheckpoints(v1::StagePlacement* p, std::vector<int64_t> steps);
  void OnReplicated(Worker& w, const v1::CheckpointReplicated& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends every running job's workers its checkpoint floor when it advanced.
  void SendFloors(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the heartbeat's running job is what this coordinator expects of `w` (then its activity
  // feeds the watchdog); cancels it if not; frees a drained worker (or one of an ended job) that
  // runs nothing any more (coordinator_watchdog.cc).
  void CheckRunning(Worker& w, const v1::Heartbeat& hb, Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker registering again with the stage it runs (after a coordinator restart).
  void Reattach(Worker& w, const v1::RunningStage& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs loaded running or recovering from the state file.
  void AfterRestart(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Running jobs whose workers did not come back in time, recoveries whose stages did not stop.
  void CheckDeadlines(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A terminal job's workers that are not running a stage of it any more become idle.
  void ReleaseWorkers(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `w` runs stage `r`, which the coordinator does not want there: BUSY, no work, until it ends.
  void Drain(Worker& w, const v1::RunningStage& r, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Progress watchdog and stragglers (coordinator_watchdog.cc).
  // A new attempt's assignments went out (Start, Resume) or a restarted coordinator loaded the job.
  void ResetProgress(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step report of the current attempt: step times, checkpoint times, each stage's compute.
  void TrackStep(Job& job, const v1::StepProgress& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat's activity of the current attempt's stage `stage`.
  void TrackActivity(Job& job, int stage, const v1::StageActivity& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Running jobs without a step for longer than their progress timeout: the hung stages' workers
  // are lost (or, when none is hung, every stage restarts on its worker).
  void CheckProgress(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetWorkerState(Worker& w, v1::WorkerState s, uint64_t job_id, const std::string& note)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Link measurement and placement (coordinator_placement.cc).
  void OnLinkReport(const Worker& w, const v1::LinkReport& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every live worker with a session which others to probe.
  void SendProbePeers(Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Chooses the job's workers among `free` (idle, in preference order), records how in its status
  // and takes them out of `free`; returns them, stage i on the i-th.
  std::vector<uint64_t> Place(Job& job, std::vector<uint64_t>* free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }
  static void Deliver(Outbox& out);
  double UnixNow() { return absl::ToDoubleSeconds(opt_.clock->Now() - absl::UnixEpoch()); }

  std::unique_ptr<Store> store_;
  const CoordinatorOptions opt_;
  absl::Mutex mu_;
  std::map<uint64_t, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // pending jobs; ids grow, so in submission order
  // The link matrix: (from, to) worker ids -> the latest probe (coordinator_placement.cc).
  std::map<std::pair<uint64_t, uint64_t>, v1::LinkMeasurement> links_ ABSL_GUARDED_BY(mu_);
  uint64_t next_worker_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_job_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumped on every job change (WatchJob waits on it)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
  // Admission (scheduler.h): per client host, after opt_.
  PeerRateLimiter submit_limiter_{"job submissions", opt_.limits.submit, opt_.clock};
  PeerRateLimiter register_limiter_{"worker registrations", opt_.limits.register_worker, opt_.clock};
  PeerRateLimiter join_limiter_{"joins", opt_.limits.join, opt_.clock};
  common::ThrottledLog refusals_{"coordinator", absl::Seconds(10), opt_.clock};  // refused RPCs, per RPC and host
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_COORDINATOR_H_
