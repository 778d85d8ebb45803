// StageExecutor: one pipeline stage's training engine. It runs forward for a micro-batch from a
// received activation (or token ids on stage 0), backward from a received activation gradient (or
// from the loss on the last stage), accumulates gradients over micro-batches, and steps AdamW with
// a warm-up + cosine learning rate. Gradient clipping is global: the caller sums every stage's
// SquaredGradNorm() and passes the resulting clip factor to Step().
//
// Parameters are initialised on the CPU (deterministically, whatever the device) and then moved to
// the stage's device; inputs and gradients arriving from links may be on any device and are moved
// there; outputs stay on it. Checkpoints are written from and read into any device.
//
// Not thread-safe: one thread (the stage's compute thread) owns an executor. LibTorch errors are
// caught here and returned as Status.
//
// Timing (TakeComputeTimes, for metrics): on the CPU, the wall time of each Forward, Backward and
// Step call, which compute synchronously. On a CUDA device those calls only queue kernels, so a
// host timer would see the launches; instead each call is bracketed by two CUDA events on the
// device's current stream, and its time is the GPU time between them (its kernels, and any gap
// in which the GPU waited for the host to launch them). Reading an event never waits: a call's
// time is reported once its kernels have finished (the step loop asks after the gradient norm,
// which the host has read, so forward and backward are in; the optimizer's kernels usually land
// in the next step's figures).
#ifndef LONGHAUL_STAGE_RUNTIME_EXECUTOR_H_
#define LONGHAUL_STAGE_RUNTIME_EXECUTOR_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage_runtime/checkpoint.h"
#include "stage_runtime/model.h"

namespace longhaul::stage_runtime {

struct OptimizerConfig {
  double lr = 3e-3;
  double min_lr = 3e-4;
  int warmup_steps = 20;
  int total_steps = 300;  // cosine decays from lr to min_lr between warm-up and total_steps
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip_norm = 1.0;  // <= 0 disables clipping
  double LearningRate(int64_t step) const;
  // The factor Step() takes, given the global (all stages) gradient norm before clipping.
  double ClipFactor(double global_norm) const {
    return clip_norm > 0 && global_norm > clip_norm ? clip_norm / (global_norm + 1e-6) : 1.0;
  }
};

// fp32: everything in float32. bf16: matrix products and attention in bfloat16 (the tensor cores'
// format), with float32 master weights, optimizer state, LayerNorm, softmax and loss — what
// PyTorch's autocast does, written out so it does not depend on the autocast API's version.
enum class Precision { kFp32, kBf16 };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);  // "fp32" | "bf16"
const char* PrecisionName(Precision p);

// "cpu", "cuda", "cuda:N"; an error names what is wrong (no CUDA in this build or on this machine,
// a device index out of range).
absl::StatusOr<torch::Device> ParseDevice(const std::string& name);

// What a stage's compute took (see Timing above).
struct ComputeTimes {
  absl::Duration forward = absl::ZeroDuration();    // Forward calls
  absl::Duration backward = absl::ZeroDuration();   // Backward calls
  absl::Duration optimizer = absl::ZeroDuration();  // Step calls (clipping and AdamW)
};

struct StageSpec {
  GptConfig model;
  LayerRange layers;
  bool first = true, last = true;
  uint64_t seed = 1;
  int micro_batches = 1;
  OptimizerConfig optimizer;
  torch::Device device = torch::kCPU;  // parameters, optimizer state and compute live here
  Precision precision = Precision::kFp32;
};

class StageExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(const StageSpec& spec);

  // Stage 0 takes token ids; others activations. On the last stage `labels` is required and the
  // returned tensor is the micro-batch's mean cross-entropy (a scalar); otherwise the activation.
  absl::StatusOr<torch::Tensor> Forward(int micro_batch, const torch::Tensor& input,
                                        const torch::Tensor& labels = {});
  // Last stage: grad_output is ignored (backward starts from the stored loss / micro_batches).
  // Returns the gradient for the previous stage (undefined on stage 0).
  absl::StatusOr<torch::Tensor> Backward(int micro_batch, const torch::Tensor& grad_output = {});
  // Forward without autograd or stored state (evaluation). Last stage returns the mean loss.
  absl::StatusOr<torch::Tensor> Evaluate(const torch::Tensor& input, const torch::Tensor& labels = {});

  double SquaredGradNorm() const;
  // Scales gradients by clip_factor, applies AdamW, zeroes gradients, advances the step.
  absl::Status Step(double clip_factor);
  // For an optimizer outside the executor (replicated stages with a sharded optimizer,
  // worker/replica_sync.h), which has set the parameters itself: zeroes the gradients and advances
  // the step. The executor's own optimizer state stays as it was.
  absl::Status AdvanceStep();
  // The stage's parameters (names as in the checkpoints), in a fixed order.
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }

  int64_t step() const { return step_; }
  const torch::Device& device() const { return spec_.device; }
  int64_t peak_stored_activations() const { return peak_stored_; }
  int64_t stored_activations() const { return static_cast<int64_t>(stored_.size()); }
  GptStage& model() { return model_; }

  // `sync_state`: what a data-parallel synchronisation keeps besides the stage's parameters and
  // optimizer state (worker/replica_sync.h: a sharded optimizer's moments and main weights of this
  // replica's shard), saved in the same file: its tensors named "__optim__.dp.<name>", its metadata
  // "dp.<key>". Loading fills `sync_state` with them (names and keys without the prefixes); with a
  // null `sync_state` they are ignored.
  absl::Status SaveCheckpoint(const std::string& path, const TensorFile* sync_state = nullptr) const;
  absl::Status LoadCheckpoint(const std::string& path, TensorFile* sync_state = nullptr);

  // The compute time of the Forward, Backward and Step calls finished since the last call (see
  // Timing above); never waits.
  ComputeTimes TakeComputeTimes();

  ~StageExecutor();

 private:
  explicit StageExecutor(const StageSpec& spec);
  class Timer;  // see Timing above
  struct Stored {
    torch::Tensor input;   // leaf with requires_grad (stages > 0)
    torch::Tensor output;  // activation, or the scaled loss on the last stage
  };
  StageSpec spec_;
  GptStage model_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::map<std::string, torch::Tensor> exp_avg_, exp_avg_sq_;
  std::map<int, Stored> stored_;
  int64_t step_ = 0;
  int64_t peak_stored_ = 0;
  std::unique_ptr<Timer> timer_;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_EXECUTOR_H_
