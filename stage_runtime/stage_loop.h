// StageLoop: one pipeline stage's training step — the one step loop of longhaul, driven by the
// in-process pipeline (pipeline.h: one thread per stage, InProcessLinks) and by the worker
// (worker/stage_runner.h: one stage per process, GrpcLinks). It knows links only through the Link
// interface (link.h).
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

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stage_runtime/data.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/link.h"
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
  bool checkpointed = false;
  // Of the step's wall time, what writing the checkpoint took (zero when none was due): throughput
  // figures leave it out (a gpt2-xl stage writes gigabytes, seconds that are not training).
  absl::Duration checkpoint_time = absl::ZeroDuration();
};

class StageLoop {
 public:
  // `prev` / `next` are null on the first / last stage; the executor and links must outlive the
  // loop.
  StageLoop(const PipelineOptions& options, int stage, StageExecutor* executor, Link* prev, Link* next,
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

  int stage() const { return stage_; }
  Link* prev() const { return prev_; }
  Link* next() const { return next_; }

  // How long Receive waits: a slow link or neighbour is not an error; a dead one closes the link,
  // and a hung one is caught by the coordinator's heartbeat timeout, which cancels the job.
  static constexpr absl::Duration kReceiveTimeout = absl::Minutes(10);

 private:
  absl::StatusOr<LinkMessage> Expect(Link& from, uint64_t step, int micro_batch, MessageKind kind);
  absl::Status Cancelled();
  absl::StatusOr<double> ExchangeNorms(uint64_t step);

  const PipelineOptions opt_;
  const int stage_;
  const bool first_, last_;
  StageExecutor* const exec_;
  Link* const prev_;
  Link* const next_;
  const CheckpointPolicy checkpoint_;
  const std::vector<PipelineOp> ops_;
  absl::Duration receive_wait_ = absl::ZeroDuration();

  absl::Mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_STAGE_LOOP_H_
