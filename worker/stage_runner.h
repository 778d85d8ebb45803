// StageRunner: runs one stage of one job on a worker. It builds what the stage needs from the
// assignment — the executor, the data sampler on the first and last stage, the codecs, a GrpcLink
// to each neighbour — and drives the stage runtime's StageLoop (stage_runtime/stage_loop.h, the
// same step loop the in-process pipeline runs) step after step, reporting progress after each.
//
// Recovery (docs/recovery.md): an assignment with a restore_step loads the stage's checkpoint of
// that step before training — from this worker's own checkpoint directory, its replicas, or
// fetched from the workers the assignment names (checkpoint_store.h). Every checkpoint written is
// also kept under its step's name and, when the assignment names a replica worker, copied there
// in the background; step files older than the coordinator's floor (SetFloor) are deleted.
//
// For the coordinator's progress watchdog it tracks what the compute thread is doing (Activity():
// setting up, computing, or waiting on the link to which neighbour, since when), reported in the
// worker's heartbeats: a stage that computes while its neighbours wait for it is the hung one.
//
// Threading: Run() is the stage's compute thread and owns the executor, the loop and the links.
// Cancel(), SetFloor(), InboxFrom(), Activity() and ReleaseTestHang() may be called from any
// thread; the replicator copies on a thread of its own and calls the replication callback there.
#ifndef LONGHAUL_WORKER_STAGE_RUNNER_H_
#define LONGHAUL_WORKER_STAGE_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/spec.h"
#include "longhaul/v1/control_plane.pb.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/stage_loop.h"
#include "worker/checkpoint_store.h"
#include "worker/grpc_link.h"
#include "worker/inbox.h"
#include "worker/replica_sync.h"
#include "worker/worker_metrics.h"

namespace longhaul::worker {

// Converts a job spec to the stage runtime's pipeline options (shared with tests that compare a
// networked job against the in-process pipeline).
absl::StatusOr<stage_runtime::PipelineOptions> ToPipelineOptions(const v1::JobSpec& spec);

class ActivityLink;
class ActivitySync;

// TEST HOOK (LONGHAUL_TEST_HANG_AT_STEP, worker/main.cc): the stage `stage` (-1: any) of a job's
// first attempt stops before computing step `at_step` (1-based) and stays stopped — deaf to
// cancellation, as a stuck kernel would be — until the worker shuts down, while the worker keeps
// sending heartbeats. at_step 0: off.
struct TestHang {
  int64_t at_step = 0;
  int stage = -1;
};

// The worker an assignment names for replica `replica` of the neighbouring stage `stage`, when this
// stage's replica exchanges micro-batches with it (proto/replica_layout.h); else null. For the
// data plane's sender check (worker.h).
const v1::StagePeer* AssignedNeighbour(const v1::StageAssignment& a, int stage, int replica);

class StageRunner {
 public:
  using ProgressFn = std::function<void(const v1::StepProgress&)>;
  using ReplicatedFn = std::function<void(const v1::CheckpointReplicated&)>;

  // `data_dir` is the worker's data directory (checkpoints go under it unless the spec names one);
  // `device` where the stage computes.
  // `metrics` (may be null; must outlive the runner) gets each step's stage and link samples.
  StageRunner(v1::StageAssignment assignment, std::string data_dir, torch::Device device, ProgressFn progress,
              WorkerMetrics* metrics = nullptr);
  ~StageRunner();

  // Where a job's stages keep their checkpoints on a worker: the spec's checkpoint dir, else
  // <data_dir>/jobs/<job id>.
  static std::string CheckpointDir(const v1::JobSpec& spec, const std::string& data_dir, uint64_t job_id);
  // This stage's checkpoint directory: CheckpointDir confined to the data directory and the allowed
  // paths (spec_paths.h; PERMISSION_DENIED otherwise), resolved, plus /replica-R for a replicated
  // stage. After SetAllowedPaths.
  absl::StatusOr<std::string> CheckedCheckpointDir() const;

  // Called with the outcome of each checkpoint copy to the replica worker (before Run).
  void OnReplicated(ReplicatedFn fn) { replicated_ = std::move(fn); }
  // The job's checkpoint floor (CheckpointFloor): older step files may go. Any thread.
  void SetFloor(int64_t step) { floor_.store(step); }
  // Largest checkpoint fetched from another worker when restoring.
  void SetFetchLimit(int64_t bytes) { fetch_limit_ = bytes; }
  // Directories besides the data directory that a spec's checkpoint.dir and data.corpus may name
  // (the operator's --allow-paths; spec_paths.h). Before Run.
  void SetAllowedPaths(std::vector<std::string> dirs) { allowed_paths_ = std::move(dirs); }
  // The test hook (before Run).
  void SetTestHang(const TestHang& h) { test_hang_ = h; }
  // The worker's Collective service (not owned), for replicated stages' synchronisation (before
  // Run; replica_sync.h).
  void SetCollective(collective::CollectiveService* s) { collective_ = s; }
  // This worker's --region: links to workers of other regions use links.between_regions_mbit.
  void SetRegion(std::string region) { region_ = std::move(region); }
  // Lets a stage stopped by the test hook go on (it then ends as cancelled). Any thread.
  void ReleaseTestHang() { hang_released_.store(true); }

  // What the compute thread is doing now (for the heartbeats). Any thread.
  v1::StageActivity Activity();

  // The inbox for frames sent by replica `from_replica` of `from_stage`, or an error if that is not
  // a neighbour of this replica.
  absl::StatusOr<std::shared_ptr<Inbox>> InboxFrom(int from_stage, int from_replica);
  const v1::StageAssignment& assignment() const { return a_; }

  // Runs the whole job on the calling thread; the result says how it ended.
  v1::JobFinished Run();

  // Makes Run() stop at its next wait (and tears the links down). Any thread. False when it had
  // been cancelled already.
  bool Cancel(absl::Status why);
  // After Run: " (stopped N s after its cancel; it was <DescribeActivity> when cancelled)" when it took
  // longer than kSlowStop to stop, else empty. For the log line that says how the stage ended.
  std::string SlowStopNote();
  static constexpr absl::Duration kSlowStop = absl::Seconds(5);

  uint64_t job_id() const { return a_.job_id(); }
  int stage() const { return a_.stage(); }
  int attempt() const { return a_.attempt(); }
  int replica() const { return a_.replica_index(); }

 private:
  struct Neighbour {
    int stage = 0, replica = 0;
    v1::StagePeer peer;
    std::shared_ptr<Inbox> inbox;
    std::unique_ptr<GrpcLink> link;
    std::unique_ptr<ActivityLink> watched;  // the loop's view of link
    double rate = 0;  // the link's configured rate (bytes/s; <= 0 unlimited), for metrics
  };
  absl::Status Setup();
  // The loop's view of prev_ or next_ (stage_runtime/link_fan.h).
  stage_runtime::LinkFan Fan(const std::vector<Neighbour>& ns) const;
  // `own` and the operator's allowed directories.
  std::vector<std::string> AllowedRoots(std::vector<std::string> own) const;
  // Replicated stages: the synchronisation among the stage's replicas (replica_sync.h;
  // stage_runner_sync.cc).
  absl::Status SetupReplicaSync();
  // Loads the checkpoint of a_.restore_step() into the executor (see the top of this file).
  absl::Status Restore(const std::string& dir);
  // After a step that wrote a checkpoint: keep it under its step's name, prune, copy it.
  void KeepCheckpoint(int64_t step);
  absl::Status RunSteps();
  // The link to a replica of the next (forward) or previous stage: a sender to it and the inbox from it.
  absl::StatusOr<std::unique_ptr<GrpcLink>> Connect(Neighbour& n, bool forward, const codec::Codec* codec);
  // The step's progress message, a replica's synchronisation figures included; fills `sample`
  // (the metrics' view of the same step) on the way (stage_runner_progress.cc).
  v1::StepProgress Progress(const stage_runtime::StepResult& r, absl::Duration took, StageStepSample* sample);
  absl::Status Cancelled();
  // The compute thread enters `phase` (on the link to `peer` for RECEIVE and SEND); returns the
  // phase it left.
  v1::StageActivity::Phase Enter(v1::StageActivity::Phase phase, int peer = -1);
  friend class ActivityLink;
  friend class ActivitySync;

  const v1::StageAssignment a_;
  const std::string data_dir_;
  const torch::Device device_;
  ProgressFn progress_;
  WorkerMetrics* const metrics_;
  const bool first_, last_;
  absl::StatusOr<codec::CodecDevice> codec_device_;  // links.codec_device, parsed once
  stage_runtime::PipelineOptions opt_;
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  std::unique_ptr<stage_runtime::StageExecutor> exec_;
  std::unique_ptr<stage_runtime::Dataset> data_;
  // The replicas of the previous and next stage this replica exchanges micro-batches with (one each
  // unless the stages' replica counts differ: proto/replica_layout.h); none at the ends. The
  // inboxes exist from construction, the links from Setup.
  std::vector<Neighbour> prev_, next_;
  absl::Status neighbours_;  // what the assignment lacks of them (Setup fails with it)
  std::unique_ptr<stage_runtime::StageLoop> loop_;
  // Replicated stages (StageReplicas > 1): the stage's replicas each run micro_batches / replicas
  // of every step (opt_.micro_batches is this replica's share) and synchronise through sync_.
  int replicas_ = 1;
  std::vector<std::string> allowed_paths_;
  collective::CollectiveService* collective_ = nullptr;
  std::string region_;
  std::unique_ptr<ReplicaSync> sync_;
  std::unique_ptr<ActivitySync> watched_sync_;  // sync_ as the loop sees it (its time is PHASE_SYNC)
  stage_runtime::TensorFile restored_sync_state_;  // Restore to SetupReplicaSync: the checkpoint's sync part
  std::string checkpoint_dir_, checkpoint_path_;
  ReplicatedFn replicated_;
  std::atomic<int64_t> floor_{0};
  int64_t fetch_limit_ = int64_t{64} << 30;
  std::unique_ptr<CheckpointReplicator> replicator_;  // null when not copied
  // Error samples of the forward link already reported (progress carries the mean since then).
  int64_t reported_error_samples_ = 0;
  double reported_error_sum_ = 0;
  TestHang test_hang_;
  std::atomic<bool> hang_released_{false};

  absl::Mutex activity_mu_;
  v1::StageActivity::Phase phase_ ABSL_GUARDED_BY(activity_mu_) = v1::StageActivity::PHASE_SETUP;
  int phase_peer_ ABSL_GUARDED_BY(activity_mu_) = -1;
  absl::Time phase_since_ ABSL_GUARDED_BY(activity_mu_) = absl::Now();
  int64_t steps_done_ ABSL_GUARDED_BY(activity_mu_) = 0;

  absl::Mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  absl::Time cancelled_at_ ABSL_GUARDED_BY(mu_);
  v1::StageActivity activity_at_cancel_ ABSL_GUARDED_BY(mu_);  // what it was doing then
  stage_runtime::StageLoop* live_loop_ ABSL_GUARDED_BY(mu_) = nullptr;  // published for Cancel()
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_STAGE_RUNNER_H_
