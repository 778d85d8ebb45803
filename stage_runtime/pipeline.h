// InProcessPipeline: S stages in one process, each a StageExecutor driven by its own StageLoop
// (stage_loop.h) on its own thread per step, joined by InProcessLinks that encode and decode every
// tensor with the link's codec (forward codec for activations, backward codec for gradients). It
// runs the same step loop as the worker, without the network: tests compare it with the
// unpartitioned model and with a multi-process job, benchmarks use it to measure what a codec
// does to convergence.
//
// Threading: the methods are called from one thread; TrainStep runs one thread per stage for the
// duration of the step (LibTorch's intra-op pool parallelises each operation as usual).
#ifndef LONGHAUL_STAGE_RUNTIME_PIPELINE_H_
#define LONGHAUL_STAGE_RUNTIME_PIPELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/codec.h"
#include "stage_runtime/data.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/in_process_link.h"
#include "stage_runtime/stage_loop.h"

namespace longhaul::stage_runtime {

class InProcessPipeline {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessPipeline>> Create(const PipelineOptions& o);
  ~InProcessPipeline();

  // One optimizer step over `micro_batches` batches (size must equal options.micro_batches). The
  // loss is the mean over micro-batches, the gradient norm the global one before clipping. A step
  // that fails tears the links down: later steps fail with the same error.
  absl::StatusOr<StepResult> TrainStep(const std::vector<Batch>& micro_batches);
  // Mean loss over `batches`, forward only, through the same codecs (not counted in the links'
  // stats).
  absl::StatusOr<double> EvalLoss(const std::vector<Batch>& batches);

  int64_t step() const { return stages_.front()->step(); }
  // Sending-side counters: forward_links()[s] is stage s's activations to s+1, backward_links()[s]
  // stage s+1's gradients to s (S-1 entries each).
  const std::vector<LinkStats>& forward_links();
  const std::vector<LinkStats>& backward_links();
  std::vector<int64_t> PeakStoredActivations() const;
  StageExecutor& stage(int i) { return *stages_[i]; }

  // One file per stage: StageCheckpointPath(dir, i).
  absl::Status SaveCheckpoint(const std::string& dir) const;
  absl::Status LoadCheckpoint(const std::string& dir);

 private:
  InProcessPipeline() = default;

  PipelineOptions opt_;
  std::vector<std::unique_ptr<StageExecutor>> stages_;
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  // links_[s] joins stages s and s+1: .first is stage s's end, .second stage s+1's.
  std::vector<std::pair<std::unique_ptr<InProcessLink>, std::unique_ptr<InProcessLink>>> links_;
  std::vector<std::unique_ptr<StageLoop>> loops_;
  std::vector<LinkStats> fwd_stats_, bwd_stats_;
  absl::Status failed_;  // the first failed step's error
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_PIPELINE_H_
