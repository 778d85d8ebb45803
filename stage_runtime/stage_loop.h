// StageLoop: one pipeline stage's training step — the one step loop of longhaul, driven by the
// in-process pipeline (pipeline.h: one thread per stage, InProcessLinks) and by the worker
// (worker/stage_runner.h: one stage per process, GrpcLinks). It knows links only through the Link
// interface (link.h), one per neighbour, or a LinkFan of them where a replica exchanges
// micro-batches with several replicas of a neighbouring stage (link_fan.h).
//
// A step: the schedule's forward and backward operations (schedule.h), taking activations from
// the previous stage and gradients from the next one and sending its own outputs on; then global
// gradient clipping without a coordinator — the partial sums of squared gradient norms travel down
// the backward chain after the step's last gradient (kNormPartial), stage 0 sends the total back up
// the forward chain (kNormTotal) — the optimizer step with the common clip factor, and the
// checkpoint when the policy says so. Stage 0 takes token batches and the last stage the matching
// labels from the caller (both sample the same deterministic sampler), so no labels cross a link.
//
// Threading: Step and Finish run on the stage's compute thread, which owns the executor and the
// links' sending sides; Cancel may be called from any thread.
#ifndef LONGHAUL_STAGE_RUNTIME_STAGE_LOOP_H_
#define LONGHAUL_STAGE_RUNTIME_STAGE_LOOP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stage_runtime/data.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/link.h"
#include "stage_runtime/link_fan.h"
#include "stage_runtime/schedule.h"

namespace longhaul::stage_runtime {

// What a pipeline trains and how (the job spec's training part; worker::ToPipelineOptions).
struct PipelineOptions {
  GptConfig model;
  int stages = 4;
  int micro_batches = 4;
  int micro_batch_size = 8;
  Schedule schedule = Schedule::k1F1B;
  std::string forward_codec = "fp32";   // activations, stage s -> s+1
  std::string backward_codec = "fp32";  // activation gradients, s+1 -> s
  OptimizerConfig optimizer;
  uint64_t seed = 1;
  int codec_threads = 1;
  Precision precision = Precision::kFp32;
  torch::Device device = torch::kCPU;  // where the in-process pipeline's stages run (a worker uses its own)
};

// Messages a link carries per step in one direction: a tensor per micro-batch and one norm. Send
// queues and inboxes hold this many, so a receiver never stops reading within a step and every send
// completes (docs/threading.md, deadlock freedom).
inline size_t LinkCapacity(const PipelineOptions& o) { return static_cast<size_t>(o.micro_batches) + 1; }

// Where a stage's checkpoint file lives: <dir>/stage-<stage>.safetensors.
std::string StageCheckpointPath(const std::string& dir, int stage);

struct CheckpointPolicy {
  std::string path;          // empty: never
  int64_t interval = 0;      // every `interval` steps (0: only after the last step)
  int64_t total_steps = 0;   // the step count after which the final checkpoint is written
};

struct StepResult {
  int64_t step = 0;       // the step just completed (0-based)
  double loss = 0;        // mean over micro-batches (computed on the last stage; 0 elsewhere)
  double grad_norm = 0;   // global, before clipping
  absl::Duration receive_wait = absl::ZeroDuration();  // blocked waiting for a neighbour
  // The executor's forward, backward and optimizer time reported during this step
  // (StageExecutor::TakeComputeTimes: on the CPU this step's; on a GPU the optimizer's kernels
  // usually count in the next step).
  ComputeTimes compute;
  bool checkpointed = false;
  // Of the step's wall time, what writing the checkpoint took (zero when none was due): throughput
  // figures leave it out (a gpt2-xl stage writes gigabytes, seconds that are not training).
  absl::Duration checkpoint_time = absl::ZeroDuration();
};

// Replicated stages (worker/replica_sync.h): after the backward pass, a stage's replicas
// synchronise their gradients and step the optimizer in place of the loop's own norm exchange and
// executor step. `exchange_norms(sq)` takes this stage's squared norm of the synchronised gradient
// and returns the whole pipeline's (the loop's chain of norm messages, along this replica's
// neighbours); `loss` is this replica's mean loss (last stage; 0 elsewhere).
class GradientSync {
 public:
  struct Outcome {
    double grad_norm = 0;  // global, before clipping
    double loss = 0;       // the mean over the stage's replicas
  };
  using ExchangeNorms = std::function<absl::StatusOr<double>(double stage_squared_norm)>;
  virtual ~GradientSync() = default;
  virtual absl::StatusOr<Outcome> SyncAndStep(uint64_t step, double loss, const ExchangeNorms& exchange_norms) = 0;
  // Makes a synchronisation in progress fail (StageLoop::Cancel). Any thread.
  virtual void Abort(const absl::Status& why) = 0;
  // What the synchronisation keeps that the stage's checkpoints must hold too (saved with them:
  // StageExecutor::SaveCheckpoint's sync_state); empty when it keeps nothing of its own.
  virtual TensorFile CheckpointState() const { return {}; }
};

class StageLoop {
 public:
  // `prev` / `next` are null on the first / last stage; the executor and links must outlive the
  // loop.
  StageLoop(const PipelineOptions& options, int stage, StageExecutor* executor, Link* prev, Link* next,
            CheckpointPolicy checkpoint = {})
      : StageLoop(options, stage, executor, LinkFan(prev), LinkFan(next), std::move(checkpoint)) {}
  // A replica whose neighbouring stages have other replica counts (link_fan.h): empty fans on the
  // first / last stage.
  StageLoop(const PipelineOptions& options, int stage, StageExecutor* executor, LinkFan prev, LinkFan next,
            CheckpointPolicy checkpoint = {});

  // One training step. `batches` holds the step's micro-batches on the first stage (tokens) and
  // the last (labels); other stages ignore it.
  absl::StatusOr<StepResult> Step(const std::vector<Batch>& batches);
  // Delivers what the links still hold (the neighbours need every message); call after the last
  // step.
  absl::Status Finish();
  // Makes Step stop at its next operation and aborts both links (waking a blocked Receive). Any
  // thread; the first reason sticks.
  void Cancel(absl::Status why);
  // Replicated stages: `sync` (not owned, outlives the loop; before the first Step) replaces the
  // norm exchange and optimizer step (GradientSync above).
  void SetGradientSync(GradientSync* sync) { sync_ = sync; }

  int stage() const { return stage_; }

  // How long Receive waits: a slow link or neighbour is not an error; a dead one closes the link,
  // and a hung one is caught by the coordinator's heartbeat timeout, which cancels the job.
  static constexpr absl::Duration kReceiveTimeout = absl::Minutes(10);

 private:
  // A tensor of this replica's micro-batch `micro_batch` from / to the fan's member that takes it
  // (sent under the member's number for it; received under this replica's).
  absl::StatusOr<LinkFan::Route> RouteOf(const LinkFan& fan, int micro_batch) const;  // an error for no member
  absl::StatusOr<LinkMessage> Receive(const LinkFan& from, uint64_t step, int micro_batch, MessageKind kind);
  absl::Status Send(const LinkFan& to, uint64_t step, int micro_batch, MessageKind kind, torch::Tensor t, bool measure);
  absl::StatusOr<LinkMessage> Expect(Link& from, uint64_t step, int micro_batch, MessageKind kind);
  // A DataLoss error naming `from` unless `m` is what Expect waits for.
  static absl::Status CheckMessage(const LinkMessage& m, const Link& from, uint64_t step, int micro_batch,
                                   MessageKind kind);
  // One micro-batch's forward (its output sent on, or its loss added on the last stage) and
  // backward (its output gradient received first, except on the last stage; the input's gradient
  // returned, undefined on the first stage).
  absl::Status Forward(uint64_t step, int micro_batch, torch::Tensor in, const std::vector<Batch>& batches,
                       double* loss_sum);
  absl::StatusOr<torch::Tensor> Backward(uint64_t step, int micro_batch);
  // A step's operations in the schedule's order (ops_), or, on GPipe's last stage of several,
  // as its inputs arrive (stage_loop.cc).
  absl::Status RunSchedule(uint64_t step, const std::vector<Batch>& batches, double* loss_sum);
  absl::Status RunLastStageOfGPipe(uint64_t step, const std::vector<Batch>& batches, double* loss_sum);
  // The norm every member of `from` sends (they agree: the replicas of a stage hold the same
  // gradients after their synchronisation); member 0's.
  absl::StatusOr<double> ExpectNorm(const LinkFan& from, uint64_t step, MessageKind kind);
  absl::Status SendNorm(const LinkFan& to, uint64_t step, MessageKind kind, double value);
  absl::Status Cancelled();
  absl::StatusOr<double> ExchangeNorms(uint64_t step, double sq);

  const PipelineOptions opt_;
  const int stage_;
  const bool first_, last_;
  StageExecutor* const exec_;
  const LinkFan prev_;
  const LinkFan next_;
  const CheckpointPolicy checkpoint_;
  const std::vector<PipelineOp> ops_;
  absl::Duration receive_wait_ = absl::ZeroDuration();
  GradientSync* sync_ = nullptr;

  absl::Mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_STAGE_LOOP_H_
