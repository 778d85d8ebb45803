// Schedules and the in-process pipeline driver.
//
// A schedule is, per stage, the order of its forward (F) and backward (B) micro-batch operations:
//   GPipe: F0 F1 ... F(M-1) B0 ... B(M-1)        (stores up to M activations)
//   1F1B:  min(S-s-1, M) warm-up forwards, then alternate F/B, then the remaining backwards
//          (PipeDream-flush; stage s stores at most S-s activations).
// InProcessPipeline wires S StageExecutors with in-memory links that encode and decode every
// tensor with the link's codec (forward codec for activations, backward codec for gradients), and
// runs the schedule's operations in dependency order on the calling thread. Used by tests and
// benchmarks to prove the engine before the network is involved.
#ifndef LONGHAUL_STAGE_RUNTIME_PIPELINE_H_
#define LONGHAUL_STAGE_RUNTIME_PIPELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/codec.h"
#include "stage_runtime/data.h"
#include "stage_runtime/executor.h"

namespace longhaul::stage_runtime {

enum class Schedule { kGPipe, k1F1B };
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);

struct PipelineOp {
  bool forward;
  int micro_batch;
};
std::vector<PipelineOp> StageSchedule(Schedule s, int stage, int stages, int micro_batches);

// Per-link counters: raw = fp32 bytes of the tensors, wire = frame bytes.
struct LinkStats {
  int64_t frames = 0;
  int64_t raw_bytes = 0;
  int64_t wire_bytes = 0;
  double sum_rel_error = 0;  // sum over frames of ||x - decode(encode(x))|| / ||x||
  double mean_rel_error() const { return frames ? sum_rel_error / frames : 0; }
};

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
};

struct StepResult {
  int64_t step = 0;     // the step just completed (0-based)
  double loss = 0;      // mean over micro-batches
  double grad_norm = 0; // global, before clipping
};

class InProcessPipeline {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessPipeline>> Create(const PipelineOptions& o);

  // One optimizer step over `micro_batches` batches (size must equal options.micro_batches).
  absl::StatusOr<StepResult> TrainStep(const std::vector<Batch>& micro_batches);
  absl::StatusOr<double> EvalLoss(const std::vector<Batch>& batches);

  int64_t step() const { return stages_.front()->step(); }
  const std::vector<LinkStats>& forward_links() const { return fwd_stats_; }   // S-1 entries
  const std::vector<LinkStats>& backward_links() const { return bwd_stats_; }
  std::vector<int64_t> PeakStoredActivations() const;
  StageExecutor& stage(int i) { return *stages_[i]; }

  // One file per stage: <dir>/stage-<i>.safetensors.
  absl::Status SaveCheckpoint(const std::string& dir) const;
  absl::Status LoadCheckpoint(const std::string& dir);

 private:
  InProcessPipeline() = default;
  absl::StatusOr<torch::Tensor> Transfer(const torch::Tensor& x, const codec::Codec& c, LinkStats* st);

  PipelineOptions opt_;
  std::vector<std::unique_ptr<StageExecutor>> stages_;
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  std::vector<LinkStats> fwd_stats_, bwd_stats_;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_PIPELINE_H_
