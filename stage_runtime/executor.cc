#include "stage_runtime/executor.h"

#include <cmath>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/torch_status.h"
#include "stage_runtime/checkpoint.h"

#ifdef LONGHAUL_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace longhaul::stage_runtime {
namespace {

constexpr char kStepKey[] = "step";
constexpr char kFormatKey[] = "format";
constexpr char kFormat[] = "longhaul-stage-v1";
constexpr char kSyncTensorPrefix[] = "__optim__.dp.";
constexpr char kSyncMetadataPrefix[] = "dp.";

enum class Phase { kForward, kBackward, kOptimizer };

absl::Duration& Slot(ComputeTimes& t, Phase p) {
  return p == Phase::kForward ? t.forward : p == Phase::kBackward ? t.backward : t.optimizer;
}

}  // namespace

// Times Forward, Backward and Step (see Timing in executor.h): Begin before a call's work, End
// after it.
class StageExecutor::Timer {
 public:
  explicit Timer(const torch::Device& device) : device_(device) {}

  void Begin() {
#ifdef LONGHAUL_WITH_CUDA
    if (device_.is_cuda()) {
      open_.emplace(cudaEventDefault);  // timing events (LibTorch's default disables timing)
      open_->record(at::cuda::getCurrentCUDAStream(device_.index()));
      return;
    }
#endif
    start_ = absl::Now();
  }

  void End(Phase p) {
#ifdef LONGHAUL_WITH_CUDA
    if (device_.is_cuda()) {
      if (!open_.has_value()) return;
      Pending q{p, std::move(*open_), at::cuda::CUDAEvent(cudaEventDefault)};
      open_.reset();
      q.end.record(at::cuda::getCurrentCUDAStream(device_.index()));
      pending_.push_back(std::move(q));
      // An owner that never asks (a benchmark) must not pile events up: the oldest go untimed.
      if (pending_.size() > kMaxPending) {
        Drain();
        while (pending_.size() > kMaxPending) pending_.pop_front();
      }
      return;
    }
#endif
    Slot(done_, p) += absl::Now() - start_;
  }

  ComputeTimes Take() {
#ifdef LONGHAUL_WITH_CUDA
    Drain();
#endif
    return std::exchange(done_, ComputeTimes{});
  }

 private:
  const torch::Device device_;
  absl::Time start_;
  ComputeTimes done_;
#ifdef LONGHAUL_WITH_CUDA
  struct Pending {
    Phase phase;
    at::cuda::CUDAEvent start, end;
  };
  static constexpr size_t kMaxPending = 4096;

  // Adds the calls whose end event has completed, in order (one stream: they finish in order).
  void Drain() {
    try {
      while (!pending_.empty() && pending_.front().end.query()) {
        const Pending& q = pending_.front();
        Slot(done_, q.phase) += absl::Milliseconds(static_cast<double>(q.start.elapsed_time(q.end)));
        pending_.pop_front();
      }
    } catch (const c10::Error&) {
      pending_.clear();  // timing is best effort; the error itself surfaces in the compute
    }
  }

  std::optional<at::cuda::CUDAEvent> open_;
  std::deque<Pending> pending_;
#endif
};

StageExecutor::~StageExecutor() = default;

ComputeTimes StageExecutor::TakeComputeTimes() { return timer_->Take(); }

double OptimizerConfig::LearningRate(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / warmup_steps;
  const double span = std::max(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("unknown precision \"", name, "\" (fp32 or bf16)"));
}

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

absl::StatusOr<torch::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name != "cuda" && name.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device \"", name, "\" (cpu, cuda or cuda:N)"));
  }
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", name, ": this LibTorch has no CUDA or the machine has no usable GPU"));
  }
  int index = 0;
  if (name.size() > 5) {
    try {
      size_t used = 0;
      index = std::stoi(name.substr(5), &used);
      if (used != name.size() - 5) index = -1;
    } catch (...) {
      index = -1;
    }
  }
  const int n = static_cast<int>(torch::cuda::device_count());
  if (index < 0 || index >= n) {
    return absl::InvalidArgumentError(absl::StrCat("device ", name, ": this machine has ", n, " GPU(s), cuda:0..cuda:", n - 1));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

StageExecutor::StageExecutor(const StageSpec& spec)
    : spec_(spec),
      model_(spec.model, spec.layers, spec.first, spec.last, spec.seed,
             spec.precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32),
      timer_(std::make_unique<Timer>(spec.device)) {
  model_->to(spec.device);
  for (auto& kv : model_->named_parameters()) {
    params_.emplace_back(kv.key(), kv.value());
    exp_avg_[kv.key()] = torch::zeros_like(kv.value());
    exp_avg_sq_[kv.key()] = torch::zeros_like(kv.value());
  }
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(const StageSpec& spec) {
  if (absl::Status s = spec.model.Validate(); !s.ok()) return s;
  if (spec.layers.begin < 0 || spec.layers.end > spec.model.layers || spec.layers.begin > spec.layers.end) {
    return absl::InvalidArgumentError("stage layer range outside the model");
  }
  if (spec.micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  return CatchTorch("create stage", [&]() -> absl::StatusOr<std::unique_ptr<StageExecutor>> {
    return std::unique_ptr<StageExecutor>(new StageExecutor(spec));
  });
}

absl::StatusOr<torch::Tensor> StageExecutor::Forward(int mb, const torch::Tensor& input,
                                                     const torch::Tensor& labels) {
  if (stored_.count(mb)) return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " already forwarded"));
  if (spec_.last && !labels.defined()) return absl::InvalidArgumentError("last stage needs labels");
  return CatchTorch("forward", [&]() -> absl::StatusOr<torch::Tensor> {
    timer_->Begin();
    Stored s;
    const torch::Tensor x = input.to(spec_.device);
    s.input = spec_.first ? x : x.detach().requires_grad_(true);
    torch::Tensor out = model_->forward(s.input);
    torch::Tensor result;
    if (spec_.last) {
      const torch::Tensor loss = torch::cross_entropy_loss(out.reshape({-1, out.size(-1)}).to(torch::kFloat32),
                                                           labels.to(spec_.device).reshape({-1}));
      s.output = loss / spec_.micro_batches;
      result = loss.detach();
    } else {
      s.output = out;
      result = out.detach();
    }
    stored_[mb] = std::move(s);
    peak_stored_ = std::max<int64_t>(peak_stored_, static_cast<int64_t>(stored_.size()));
    timer_->End(Phase::kForward);
    return result;
  });
}

absl::StatusOr<torch::Tensor> StageExecutor::Backward(int mb, const torch::Tensor& grad_output) {
  auto it = stored_.find(mb);
  if (it == stored_.end()) return absl::FailedPreconditionError(absl::StrCat("backward of micro-batch ", mb, " before its forward"));
  if (!spec_.last && !grad_output.defined()) return absl::InvalidArgumentError("backward needs the output gradient");
  return CatchTorch("backward", [&]() -> absl::StatusOr<torch::Tensor> {
    timer_->Begin();
    Stored s = std::move(it->second);
    stored_.erase(it);
    if (spec_.last) {
      s.output.backward();
    } else {
      if (grad_output.sizes() != s.output.sizes()) {
        return absl::InvalidArgumentError("activation gradient shape does not match the activation");
      }
      s.output.backward(grad_output.to(s.output.device(), s.output.scalar_type()));
    }
    torch::Tensor g = spec_.first ? torch::Tensor() : s.input.grad().detach();
    timer_->End(Phase::kBackward);
    return g;
  });
}

absl::StatusOr<torch::Tensor> StageExecutor::Evaluate(const torch::Tensor& input, const torch::Tensor& labels) {
  return CatchTorch("evaluate", [&]() -> absl::StatusOr<torch::Tensor> {
    torch::NoGradGuard no_grad;
    torch::Tensor out = model_->forward(input.to(spec_.device));
    if (!spec_.last) return out;
    return torch::cross_entropy_loss(out.reshape({-1, out.size(-1)}).to(torch::kFloat32),
                                     labels.to(spec_.device).reshape({-1}));
  });
}

double StageExecutor::SquaredGradNorm() const {
  // Summed on the device, read once (one synchronisation instead of one per parameter).
  torch::Tensor s = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(spec_.device));
  for (const auto& [name, p] : params_) {
    if (p.grad().defined()) s += p.grad().to(torch::kFloat64).pow(2).sum();
  }
  return s.item<double>();
}

absl::Status StageExecutor::Step(double clip_factor) {
  if (!stored_.empty()) return absl::FailedPreconditionError("optimizer step with micro-batches still in flight");
  return CatchTorch("optimizer step", [&]() -> absl::Status {
    timer_->Begin();
    torch::NoGradGuard no_grad;
    const OptimizerConfig& o = spec_.optimizer;
    const double lr = o.LearningRate(step_);
    const double t = static_cast<double>(step_ + 1);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    // The update runs as LibTorch's multi-tensor (_foreach_) kernels over all parameters at once:
    // a handful of kernel launches per step instead of about ten per parameter, with the same
    // elementwise operations in the same order as the per-parameter form
    //   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  p *= 1 - lr*wd (matrices only);
    //   p -= lr/bc1 * m / (sqrt(v/bc2) + eps)
    // so the results are the same numbers.
    std::vector<torch::Tensor> ps, gs, ms, vs, decayed;
    for (auto& [name, p] : params_) {
      torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      ps.push_back(p);
      gs.push_back(g);
      ms.push_back(exp_avg_[name]);
      vs.push_back(exp_avg_sq_[name]);
      // Decoupled weight decay on matrices only (not biases, norms).
      if (p.dim() >= 2) decayed.push_back(p);
    }
    if (!ps.empty()) {
      if (clip_factor != 1.0) torch::_foreach_mul_(gs, clip_factor);
      torch::_foreach_mul_(ms, o.beta1);
      torch::_foreach_add_(ms, gs, 1 - o.beta1);
      torch::_foreach_mul_(vs, o.beta2);
      torch::_foreach_addcmul_(vs, gs, gs, 1 - o.beta2);
      if (!decayed.empty()) torch::_foreach_mul_(decayed, 1 - lr * o.weight_decay);
      std::vector<torch::Tensor> denom = torch::_foreach_div(vs, bc2);
      torch::_foreach_sqrt_(denom);
      torch::_foreach_add_(denom, o.eps);
      torch::_foreach_addcdiv_(ps, ms, denom, -lr / bc1);
      torch::_foreach_zero_(gs);
    }
    timer_->End(Phase::kOptimizer);
    ++step_;
    return absl::OkStatus();
  });
}

absl::Status StageExecutor::AdvanceStep() {
  if (!stored_.empty()) return absl::FailedPreconditionError("optimizer step with micro-batches still in flight");
  return CatchTorch("advance step", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : params_) {
      if (p.grad().defined()) p.grad().zero_();
    }
    ++step_;
    return absl::OkStatus();
  });
}

absl::Status StageExecutor::SaveCheckpoint(const std::string& path, const TensorFile* sync_state) const {
  return CatchTorch("save checkpoint", [&]() -> absl::Status {
    TensorFile f;
    for (const auto& [name, p] : params_) {
      f.tensors[name] = p;
      f.tensors["__optim__.exp_avg." + name] = exp_avg_.at(name);
      f.tensors["__optim__.exp_avg_sq." + name] = exp_avg_sq_.at(name);
    }
    if (sync_state != nullptr) {
      for (const auto& [name, t] : sync_state->tensors) f.tensors[kSyncTensorPrefix + name] = t;
      for (const auto& [key, v] : sync_state->metadata) f.metadata[kSyncMetadataPrefix + key] = v;
    }
    f.metadata[kStepKey] = std::to_string(step_);
    f.metadata[kFormatKey] = kFormat;
    return WriteSafetensors(path, f);
  });
}

absl::Status StageExecutor::LoadCheckpoint(const std::string& path, TensorFile* sync_state) {
  absl::StatusOr<TensorFile> f = ReadSafetensors(path);
  if (!f.ok()) return f.status();
  auto fmt = f->metadata.find(kFormatKey);
  auto st = f->metadata.find(kStepKey);
  if (fmt == f->metadata.end() || fmt->second != kFormat || st == f->metadata.end()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is not a longhaul stage checkpoint"));
  }
  int64_t step = 0;
  try {
    step = std::stoll(st->second);
  } catch (...) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": bad step \"", st->second, "\""));
  }
  // Check everything before changing anything.
  for (const auto& [name, p] : params_) {
    for (const std::string& key : {name, "__optim__.exp_avg." + name, "__optim__.exp_avg_sq." + name}) {
      auto it = f->tensors.find(key);
      if (it == f->tensors.end()) return absl::DataLossError(absl::StrCat("checkpoint ", path, " lacks tensor ", key));
      if (it->second.sizes() != p.sizes()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", path, ": tensor ", key, " has shape ",
                                                c10::str(it->second.sizes()), ", the stage expects ", c10::str(p.sizes())));
      }
    }
  }
  TensorFile sync;
  for (const auto& [name, t] : f->tensors) {
    if (absl::StartsWith(name, kSyncTensorPrefix)) sync.tensors[name.substr(sizeof(kSyncTensorPrefix) - 1)] = t;
  }
  for (const auto& [key, v] : f->metadata) {
    if (absl::StartsWith(key, kSyncMetadataPrefix)) sync.metadata[key.substr(sizeof(kSyncMetadataPrefix) - 1)] = v;
  }
  if (f->tensors.size() != 3 * params_.size() + sync.tensors.size()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " holds tensors this stage does not have"));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    p.copy_(f->tensors[name]);
    exp_avg_[name].copy_(f->tensors["__optim__.exp_avg." + name]);
    exp_avg_sq_[name].copy_(f->tensors["__optim__.exp_avg_sq." + name]);
  }
  step_ = step;
  if (sync_state != nullptr) *sync_state = std::move(sync);
  return absl::OkStatus();
}

}  // namespace longhaul::stage_runtime
