// longhaul-bench stage: what one pipeline stage (a stage_runtime::StageExecutor) does per optimizer
// step on one device -- forward + backward of --micro-batches micro-batches, then one AdamW step -- reported as tokens/s, achieved TFLOP/s, MFU against
// the device's datasheet peak, and against one matrix product of the stage's largest shape timed in
// the same run (the ceiling this device and LibTorch actually reach).
//
// Threading: one thread drives the executor (as a worker's compute thread does); LibTorch uses its
// own intra-op threads on the CPU and its CUDA stream on a GPU. The clock is read only after the
// device is synchronised, so queued GPU work is never mistaken for finished work.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#ifdef LONGHAUL_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/str_cat.h"
#include "bench/benchmarks.h"
#include "bench/torch_trace.h"
#include "common/flags.h"
#include "common/torch_status.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/model_presets.h"

namespace longhaul::bench {
namespace {

using Clock = std::chrono::steady_clock;
using stage_runtime::Precision;

constexpr char kFlopsFormula[] =
    "flops_per_token = 6*N + 12*L*H*T, N = the stage's matrix-multiply weights (12*H^2 per block, "
    "+ H*V for the LM head with --last; embeddings and biases excluded), L = blocks, H = hidden, "
    "T = context; forward + backward = 3 x forward (PaLM / nanoGPT MFU count, causal mask not "
    "discounted)";

struct Flags {
  std::string device = "auto", preset = "gpt2-small", precision = "fp32";
  int64_t layers = 12, micro_batch_size = 8;
  int64_t micro_batches = 4;  // the job's default: the stage runtime steps once per this many
  int64_t hidden = 0, heads = 0, context = 0, vocab = 0;  // 0: the preset's
  int64_t warmup = 3, iters = 10, seed = 1;
  double peak_tflops = 0;  // 0: from the device name
  bool first = false, last = false, json = false;
  std::string trace;  // --trace: one more iteration under LibTorch's profiler, a Chrome trace
};

// A datasheet peak (dense, no sparsity) for the device and precision; tflops 0 when not known.
struct Peak {
  double tflops = 0;
  std::string source;
};

// fp32 peaks are the non-tensor-core figures: LibTorch leaves TF32 off for matrix products by
// default, and this benchmark does not turn it on.
Peak DatasheetPeak(const std::string& name, Precision p) {
  const bool bf16 = p == Precision::kBf16;
  const char* what = bf16 ? "bf16 dense tensor core" : "fp32 without TF32";
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") || has("H200")) {
    const char* chip = has("H200") ? "H200" : "H100";
    if (has("PCIe")) return {bf16 ? 756.0 : 51.0, absl::StrCat(chip, " PCIe datasheet, ", what)};
    if (has("NVL")) return {bf16 ? 835.0 : 60.0, absl::StrCat(chip, " NVL datasheet, ", what)};
    return {bf16 ? 989.0 : 67.0, absl::StrCat(chip, " SXM datasheet, ", what)};
  }
  if (has("A100")) return {bf16 ? 312.0 : 19.5, absl::StrCat("A100 datasheet, ", what)};
  return {0, "unknown"};
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

std::string DeviceName(const torch::Device& d) {
  if (!d.is_cuda()) return CpuModelName();
#ifdef LONGHAUL_WITH_CUDA
  return at::cuda::getDeviceProperties(d.index())->name;
#else
  return "unknown (built without the CUDA parts, LONGHAUL_WITH_CUDA)";
#endif
}

void Synchronize(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// The CUDA allocator's statistics exist once it has allocated on the device (the executor's
// weights), and only for LibTorch's own allocator: where they throw, the figure is "unknown".
void ResetPeakMemory(const torch::Device& d) {
#ifdef LONGHAUL_WITH_CUDA
  try {
    if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
  } catch (const c10::Error&) {
  }
#endif
}

// Peak bytes and where the figure comes from; nullopt where this build cannot read it.
std::pair<std::optional<int64_t>, std::string> PeakMemory(const torch::Device& d) {
  if (d.is_cuda()) {
#ifdef LONGHAUL_WITH_CUDA
    // allocated_bytes[0] is the aggregate over all pools (StatType::AGGREGATE == 0; the enum
    // moved namespaces between LibTorch 1.13 and 2.x, the index did not).
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
      return {stats.allocated_bytes[0].peak,
              "CUDA caching allocator: peak allocated bytes (weights, optimizer state, activations)"};
    } catch (const c10::Error& e) {
      return {std::nullopt, absl::StrCat("unknown (CUDA allocator statistics: ", e.what_without_backtrace(), ")")};
    }
#else
    return {std::nullopt, "unknown (built without the CUDA parts, LONGHAUL_WITH_CUDA)"};
#endif
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {int64_t{u.ru_maxrss} * 1024, "max RSS of the whole process (getrusage)"};
}

// The autograd nodes a forward recorded, walked from its output (the leaves' AccumulateGrad
// included): each runs once in the backward, so with the forward's operators they are most of the
// host's work per micro-batch on a GPU.
int64_t AutogradNodes(const torch::Tensor& out) {
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  if (out.grad_fn()) todo.push_back(out.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const torch::autograd::Edge& e : n->next_edges()) {
      if (e.function) todo.push_back(e.function.get());
    }
  }
  return static_cast<int64_t>(seen.size());
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// TFLOP/s of [m, k] x [k, n] products in `dtype`: after a warm-up, batches of products sized to
// about 50 ms each (so a GPU's launch and synchronisation cost is amortised), median of up to 5
// batches or of what fits in about 1 s.
double MatmulTflops(const torch::Device& d, torch::ScalarType dtype, int64_t m, int64_t k, int64_t n) {
  const auto opts = torch::TensorOptions().device(d).dtype(dtype);
  const torch::Tensor a = torch::randn({m, k}, opts), b = torch::randn({k, n}, opts);
  torch::Tensor c = torch::matmul(a, b);
  Synchronize(d);
  auto t0 = Clock::now();
  c = torch::matmul(a, b);
  Synchronize(d);
  const double one = std::max(1e-7, Seconds(t0, Clock::now()));
  const int per_batch = static_cast<int>(std::clamp(0.05 / one, 1.0, 10000.0));
  std::vector<double> per_product;
  const auto start = Clock::now();
  while (per_product.size() < 5 && (per_product.empty() || Seconds(start, Clock::now()) < 1.0)) {
    t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) c = torch::matmul(a, b);
    Synchronize(d);
    per_product.push_back(Seconds(t0, Clock::now()) / per_batch);
  }
  std::sort(per_product.begin(), per_product.end());
  return 2.0 * m * k * n / per_product[per_product.size() / 2] / 1e12;
}

int Run(const Flags& f, const CLI::App& cmd) {
  // Input checks: "longhaul-bench stage: <problem>" and exit status 2.
  auto bad = [&cmd](const std::string& message) { return common::FlagError(cmd, message); };
  const stage_runtime::ModelPreset* preset = stage_runtime::FindModelPreset(f.preset);
  if (!preset) {
    return bad(absl::StrCat("unknown --preset \"", f.preset, "\" (",
                                               stage_runtime::ModelPresetNames(), ")"));
  }
  if (f.layers < 1) return bad("--layers must be >= 1");
  if (f.micro_batch_size < 1) return bad("--micro-batch-size must be >= 1");
  if (f.micro_batches < 1 || f.micro_batches > 1024) return bad("--micro-batches must be in 1..1024");
  if (f.iters < 1) return bad("--iters must be >= 1");
  if (f.warmup < 0) return bad("--warmup must be >= 0");
  if (f.peak_tflops < 0) return bad("--peak-tflops must be >= 0");
  if (f.hidden < 0 || f.heads < 0 || f.context < 0 || f.vocab < 0) {
    return bad("--hidden, --heads, --context and --vocab must be >= 1 (0: the preset's)");
  }
  auto precision = stage_runtime::ParsePrecision(f.precision);
  if (!precision.ok()) return bad(std::string(precision.status().message()));
  const std::string device_flag =
      f.device != "auto" ? f.device : torch::cuda::is_available() ? "cuda:0" : "cpu";
  auto device = stage_runtime::ParseDevice(device_flag);
  if (!device.ok()) return bad(std::string(device.status().message()));

  stage_runtime::StageSpec spec;
  spec.model.hidden = static_cast<int>(f.hidden ? f.hidden : preset->hidden);
  spec.model.heads = static_cast<int>(f.heads ? f.heads : preset->heads);
  spec.model.context = static_cast<int>(f.context ? f.context : preset->context);
  spec.model.vocab = static_cast<int>(f.vocab ? f.vocab : preset->vocab);
  const bool custom = spec.model.hidden != preset->hidden || spec.model.heads != preset->heads ||
                      spec.model.vocab != preset->vocab;
  const int layers = static_cast<int>(f.layers);
  // The stage's blocks sit where such a stage would in the preset's model (first: at the start,
  // last: at the end, middle: in the middle); only the blocks' names and the initialisation scale
  // depend on it. A stage with more blocks than the preset has is taken from a deeper model.
  spec.model.layers = f.first && f.last ? layers : std::max(layers, preset->layers);
  const int begin = f.first ? 0 : f.last ? spec.model.layers - layers : (spec.model.layers - layers) / 2;
  spec.layers = {begin, begin + layers};
  spec.first = f.first;
  spec.last = f.last;
  spec.seed = static_cast<uint64_t>(f.seed);
  spec.micro_batches = static_cast<int>(f.micro_batches);
  spec.device = *device;
  spec.precision = *precision;
  if (absl::Status s = spec.model.Validate(); !s.ok()) return bad(std::string(s.message()));

  // Measurement failures (out of memory, ...): exit status 1.
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "longhaul-bench stage: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  const int64_t B = f.micro_batch_size, T = spec.model.context, H = spec.model.hidden;
  const std::string device_name = DeviceName(spec.device);
  auto exec = stage_runtime::StageExecutor::Create(spec);
  if (!exec.ok()) return fail(exec.status());
  int64_t params = 0, matmul_params = 0;
  for (const auto& kv : (*exec)->model()->named_parameters()) {
    params += kv.value().numel();
    // Linear weights are the 2-D parameters other than the embedding tables (lookups, no FLOPs).
    if (kv.value().dim() == 2 && kv.key() != "wte.weight" && kv.key() != "wpe.weight") {
      matmul_params += kv.value().numel();
    }
  }

  // Random inputs made on the device once, so no host-to-device copy is timed.
  torch::Tensor input, labels, grad;
  absl::Status made = CatchTorch("make inputs", [&]() -> absl::Status {
    const auto on = torch::TensorOptions().device(spec.device);
    input = f.first ? torch::randint(spec.model.vocab, {B, T}, on.dtype(torch::kLong))
                    : torch::randn({B, T, H}, on.dtype(torch::kFloat32));
    if (f.last) {
      labels = torch::randint(spec.model.vocab, {B, T}, on.dtype(torch::kLong));
    } else {
      grad = torch::randn({B, T, H}, on.dtype(torch::kFloat32));
    }
    return absl::OkStatus();
  });
  if (!made.ok()) return fail(made);

  // One micro-batch's forward through the model alone, for its graph's size (no timing).
  int64_t autograd_nodes = 0;
  absl::Status counted = CatchTorch("count autograd nodes", [&]() -> absl::Status {
    const torch::Tensor x = f.first ? input : input.detach().requires_grad_(true);
    autograd_nodes = AutogradNodes((*exec)->model()->forward(x));
    return absl::OkStatus();
  });
  if (!counted.ok()) return fail(counted);
  ResetPeakMemory(spec.device);
  // One iteration = what the stage does per optimizer step: M micro-batches, each forward then
  // backward (one micro-batch's activations alive at a time, as at the steady state of a 1F1B
  // schedule on this stage), then one Step. The device is also synchronised just before the step,
  // so the step's own time can be reported (the extra synchronisation costs microseconds).
  // `issued` is when the host has queued the micro-batches' work. On a GPU an issue time near the
  // iteration's says the host waited: on its own launches and operators, on a synchronisation
  // inside the stage, or on a full launch queue (the GPU's pace); --context smaller tells them
  // apart (the host's work per micro-batch stays, the GPU's shrinks), --trace shows it.
  std::vector<double> times, step_times, issue_times, micro_batch_times;
  struct Times {
    double total, issue, micro_batches, step;
  };
  auto iteration = [&]() -> absl::StatusOr<Times> {
    Synchronize(spec.device);
    const auto t0 = Clock::now();
    for (int mb = 0; mb < static_cast<int>(f.micro_batches); ++mb) {
      auto out = (*exec)->Forward(mb, input, labels);
      if (!out.ok()) return out.status();
      auto back = (*exec)->Backward(mb, grad);
      if (!back.ok()) return back.status();
    }
    const auto issued = Clock::now();
    Synchronize(spec.device);
    const auto t1 = Clock::now();
    if (absl::Status s = (*exec)->Step(1.0); !s.ok()) return s;
    Synchronize(spec.device);
    const auto t2 = Clock::now();
    return Times{Seconds(t0, t2), Seconds(t0, issued), Seconds(t0, t1), Seconds(t1, t2)};
  };
  for (int64_t i = 0; i < f.warmup + f.iters; ++i) {
    absl::StatusOr<Times> t = iteration();
    if (!t.ok()) return fail(t.status());
    if (i >= f.warmup) {
      times.push_back(t->total);
      step_times.push_back(t->step);
      issue_times.push_back(t->issue);
      micro_batch_times.push_back(t->micro_batches / static_cast<double>(f.micro_batches));
    }
  }
  const auto [peak_memory, memory_source] = PeakMemory(spec.device);
  // The traced iteration counts in no figure; where it fails (a LibTorch without Kineto, such as
  // Debian's) the figures are still reported, and the exit status is 1.
  absl::Status traced = absl::OkStatus();
  if (!f.trace.empty()) {
    traced = TraceTo(f.trace, spec.device, [&]() { return iteration().status(); });
    if (traced.ok()) std::fprintf(stderr, "longhaul-bench stage: one more iteration traced into %s\n", f.trace.c_str());
  }
  auto report_trace = [&]() { return traced.ok() ? 0 : fail(traced); };
  std::sort(times.begin(), times.end());
  std::sort(step_times.begin(), step_times.end());
  std::sort(issue_times.begin(), issue_times.end());
  std::sort(micro_batch_times.begin(), micro_batch_times.end());
  auto median_of = [](const std::vector<double>& v) {
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double median = median_of(times), step_median = median_of(step_times);
  const double issue_median = median_of(issue_times), micro_batch_median = median_of(micro_batch_times);
  const int64_t tokens_per_iter = f.micro_batches * B * T;

  const int64_t flops_per_token = 6 * matmul_params + 12 * int64_t{layers} * H * T;
  const double tokens_per_s = static_cast<double>(tokens_per_iter) / median;
  const double tflops = static_cast<double>(flops_per_token) * tokens_per_s / 1e12;
  const Peak peak = f.peak_tflops > 0 ? Peak{f.peak_tflops, "--peak-tflops"} : DatasheetPeak(device_name, *precision);

  // Reference: the block's largest product (the MLP's c_fc, [B*T, H] x [H, 4H]) alone.
  const torch::ScalarType compute = *precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  double matmul_tflops = 0;
  absl::Status mm = CatchTorch("matmul reference", [&]() -> absl::Status {
    matmul_tflops = MatmulTflops(spec.device, compute, B * T, H, 4 * H);
    return absl::OkStatus();
  });
  if (!mm.ok()) return fail(mm);
  const std::string matmul_shape = absl::StrCat("[", B * T, " x ", H, "] x [", H, " x ", 4 * H, "] ",
                                                stage_runtime::PrecisionName(*precision));

  const std::string role = f.first && f.last ? "whole model" : f.first ? "first stage" : f.last ? "last stage" : "middle stage";
  if (f.json) {
    nlohmann::ordered_json out = {
        {"device", device_flag},
        {"device_name", device_name},
        {"preset", custom ? std::string("custom") : f.preset},
        {"stage", role},
        {"layers", layers},
        {"hidden", H},
        {"heads", spec.model.heads},
        {"context", T},
        {"vocab", spec.model.vocab},
        {"micro_batch_size", B},
        {"micro_batches", f.micro_batches},
        {"tokens_per_iter", tokens_per_iter},
        {"iteration", "micro_batches x (forward + backward) + one AdamW step; tokens_per_iter = micro_batches * B * T"},
        {"precision", stage_runtime::PrecisionName(*precision)},
        {"params", params},
        {"matmul_params", matmul_params},
        {"warmup", f.warmup},
        {"iters", f.iters},
        {"torch_threads", torch::get_num_threads()},
        {"tokens_per_s", Round(tokens_per_s, 1)},
        {"tflops", Round(tflops, 4)},
    };
    if (peak.tflops > 0) {
      out["peak_tflops"] = peak.tflops;
      out["mfu"] = Round(tflops / peak.tflops, 4);
    } else {
      out["peak_tflops"] = "unknown";
    }
    out["peak_source"] = peak.source;
    out["matmul_tflops"] = Round(matmul_tflops, 4);
    out["matmul_shape"] = matmul_shape;
    out["flops_formula"] = kFlopsFormula;
    out["flops_per_token"] = flops_per_token;
    out["peak_memory_bytes"] = peak_memory ? nlohmann::ordered_json(*peak_memory) : nlohmann::ordered_json();
    out["peak_memory_source"] = memory_source;
    out["iter_seconds_median"] = Round(median, 6);
    out["iter_seconds_min"] = Round(times.front(), 6);
    out["step_seconds"] = Round(step_median, 6);  // the optimizer step alone, median
    out["step_fraction"] = Round(step_median / median, 4);
    out["issue_seconds"] = Round(issue_median, 6);  // the host's queueing of the micro-batches, median
    out["micro_batch_seconds"] = Round(micro_batch_median, 6);  // forward + backward of one, median
    out["autograd_nodes"] = autograd_nodes;  // one micro-batch's graph, the model's forward alone
    std::printf("%s\n", out.dump().c_str());
    return report_trace();
  }
  std::printf("%s on %s (%s), %d threads\n", role.c_str(), device_flag.c_str(), device_name.c_str(),
              torch::get_num_threads());
  std::printf("  shape          %s: %d blocks, hidden %lld, %d heads, context %lld, vocab %d; %lld micro-batches of %lld, %s\n",
              custom ? "custom" : f.preset.c_str(), layers, (long long)H, spec.model.heads, (long long)T,
              spec.model.vocab, (long long)f.micro_batches, (long long)B, stage_runtime::PrecisionName(*precision));
  std::printf("  parameters     %.2f M (%.2f M in matrix products)\n", params / 1e6, matmul_params / 1e6);
  std::printf("  iteration      median %.4f s, min %.4f s (%lld x (forward + backward) + one AdamW step; %lld timed after %lld warm-up)\n",
              median, times.front(), (long long)f.micro_batches, (long long)f.iters, (long long)f.warmup);
  std::printf("  step           median %.4f s (the AdamW step alone, %.1f%% of the iteration)\n", step_median,
              100 * step_median / median);
  std::printf("  micro-batch    %.4f s forward + backward; the host queued the %lld in %.4f s (median); "
              "%lld autograd nodes\n",
              micro_batch_median, (long long)f.micro_batches, issue_median, (long long)autograd_nodes);
  std::printf("  tokens/s       %.1f (%lld tokens per iteration / median)\n", tokens_per_s, (long long)tokens_per_iter);
  std::printf("  achieved       %.3f TFLOP/s (6*N + 12*L*H*T FLOPs per token)\n", tflops);
  if (peak.tflops > 0) {
    std::printf("  peak           %.1f TFLOP/s (%s): MFU %.1f%%\n", peak.tflops, peak.source.c_str(),
                100 * tflops / peak.tflops);
  } else {
    std::printf("  peak           unknown for this device (--peak-tflops sets it): no MFU\n");
  }
  std::printf("  matmul         %.3f TFLOP/s (one %s product, measured now%s)\n", matmul_tflops,
              matmul_shape.c_str(),
              peak.tflops > 0 ? absl::StrCat(": ", static_cast<int>(100 * matmul_tflops / peak.tflops + 0.5), "% of peak").c_str() : "");
  if (peak_memory) {
    std::printf("  peak memory    %.3f GiB, %s\n", *peak_memory / 1073741824.0, memory_source.c_str());
  } else {
    std::printf("  peak memory    %s\n", memory_source.c_str());
  }
  return report_trace();
}

}  // namespace

BenchmarkRun AddStageBench(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "stage", "one pipeline stage's micro-batches + optimizer step: tokens/s, TFLOP/s, MFU, memory");
  cmd->add_option("--device", f->device, "cpu, cuda or cuda:N; auto: cuda:0 when a GPU is usable, else cpu")
      ->type_name("DEVICE");
  cmd->add_option("--preset", f->preset, "model shape: " + stage_runtime::ModelPresetNames())->type_name("NAME");
  cmd->add_option("--layers", f->layers, "transformer blocks in the stage (>= 1)")->type_name("N");
  cmd->add_option("--micro-batch-size", f->micro_batch_size, "sequences per micro-batch (B)")->type_name("N");
  cmd->add_option("--micro-batches", f->micro_batches,
                  "micro-batches per optimizer step (M; the job's default, 4): an iteration is M forward + "
                  "backward passes and one step")
      ->type_name("M");
  cmd->add_option("--precision", f->precision, "fp32 or bf16 (matrix products and attention in bf16, fp32 master weights)")
      ->type_name("NAME");
  cmd->add_option("--hidden", f->hidden, "hidden size (0: the preset's)")->type_name("N");
  cmd->add_option("--heads", f->heads, "attention heads (0: the preset's)")->type_name("N");
  cmd->add_option("--context", f->context, "tokens per sequence, T (0: the preset's, 1024 for GPT-2)")->type_name("N");
  cmd->add_option("--vocab", f->vocab, "vocabulary, used with --first/--last (0: the preset's)")->type_name("N");
  cmd->add_flag("--first", f->first, "first stage: token ids in, with the embeddings");
  cmd->add_flag("--last", f->last, "last stage: with the final LayerNorm, LM head and loss");
  cmd->add_option("--warmup", f->warmup, "untimed iterations first")->type_name("N");
  cmd->add_option("--iters", f->iters, "timed iterations (>= 1)")->type_name("N");
  cmd->add_option("--seed", f->seed, "weight initialisation seed")->type_name("N");
  cmd->add_option("--peak-tflops", f->peak_tflops, "peak TFLOP/s for MFU (0: from the device name, see below)")
      ->type_name("X");
  cmd->add_flag("--json", f->json, "one JSON object instead of lines of text");
  cmd->add_option("--trace", f->trace,
                  "after the timed iterations, one more under LibTorch's profiler (host operators, and the "
                  "GPU's kernels on a GPU), written to FILE as a Chrome trace (not counted in the figures; needs a "
                  "LibTorch with Kineto, as the PyTorch wheel's: Debian's has none)")
      ->type_name("FILE");
  cmd->footer(
      "Builds one stage (stage_runtime::StageExecutor) of --layers GPT-2 blocks; without --first and\n"
      "--last a middle stage: input hidden states [B, T, H], no embeddings or LM head. Random input,\n"
      "output gradient (and labels with --last) are made on the device once; each iteration is what\n"
      "the stage does per optimizer step: --micro-batches (M) x (Forward + Backward), then one Step\n"
      "(AdamW), timed between device synchronisations; the step's cost is thus amortised over M\n"
      "micro-batches, as in training. Reports (JSON keys):\n"
      "  tokens_per_s         M*B*T (tokens_per_iter) / median iteration time\n"
      "  tflops               flops_per_token * tokens_per_s, flops_per_token = 6*N + 12*L*H*T with\n"
      "                       N the stage's matrix-multiply weights (12*H^2 per block, + H*V for the LM\n"
      "                       head with --last), L blocks: forward + backward = 3 x forward, the\n"
      "                       PaLM / nanoGPT count (stated in flops_formula)\n"
      "  peak_tflops, mfu     datasheet dense peak from the device name: H100/H200 SXM bf16 989, fp32\n"
      "                       67 (TF32 stays off); PCIe 756/51; NVL 835/60; A100 bf16 312, fp32 19.5;\n"
      "                       --peak-tflops overrides; otherwise \"unknown\" and no mfu key\n"
      "  matmul_tflops        one [B*T, H] x [H, 4H] product in the stage's precision on the same\n"
      "                       device, measured in this run: the ceiling next to the peak\n"
      "  peak_memory_bytes    CUDA: the caching allocator's peak allocated bytes; CPU: the process's\n"
      "                       max RSS; null when this build cannot read it\n"
      "  iter_seconds_median, iter_seconds_min\n"
      "  step_seconds         the AdamW step alone (median, inside the iteration); step_fraction:\n"
      "                       step_seconds / iter_seconds_median\n"
      "  micro_batches, tokens_per_iter   M and M*B*T\n"
      "  preset               --preset, or \"custom\" when --hidden, --heads or --vocab change its shape\n"
      "Bad flags (unknown preset, unusable device, --layers < 1, ...) exit with status 2, a failure\n"
      "while measuring (out of memory, ...) with 1.");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
