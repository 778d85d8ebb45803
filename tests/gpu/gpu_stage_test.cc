// Stages on CUDA (label `gpu`): the same pipeline gives the same losses on the GPU as on the CPU
// (fp32, TF32 off), bf16 compute trains, checkpoints move between devices, and MixedLinear's
// cuBLAS products are the plain form's bit for bit at a GPT-2-XL layer's shape. On a machine
// without a usable GPU (or with a CPU-only LibTorch, such as Debian's) every test is skipped with
// the reason (ctest lists them as skipped). bf16 on the CPU is covered by the runtime tests.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "stage_runtime/mixed_linear.h"
#include "stage_runtime/pipeline.h"

namespace longhaul::stage_runtime {
namespace {

std::string WhyNoCuda() {
  if (!torch::cuda::is_available()) {
    return "no CUDA device: this LibTorch has no CUDA support (Debian's libtorch-dev is CPU-only) or no GPU is "
           "visible; see docs/gpu.md";
  }
  return "";
}

PipelineOptions Small(torch::Device device, Precision precision) {
  PipelineOptions o;
  o.model = {/*layers=*/4, /*hidden=*/128, /*heads=*/4, /*context=*/64, /*vocab=*/256};
  o.stages = 4;
  o.micro_batches = 4;
  o.micro_batch_size = 4;
  o.optimizer.warmup_steps = 5;
  o.optimizer.total_steps = 40;
  o.seed = 5;
  o.device = device;
  o.precision = precision;
  return o;
}

const TextDataset& Data() {
  static const TextDataset* d = [] {
    auto r = TextDataset::DefaultCorpus();
    EXPECT_TRUE(r.ok()) << r.status();
    return new TextDataset(std::move(*r));
  }();
  return *d;
}

std::vector<double> Train(InProcessPipeline& p, const PipelineOptions& o, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<Batch> b;
    for (int m = 0; m < o.micro_batches; ++m) {
      b.push_back(Data().Sample(Split::kTrain, o.seed, s, m, o.micro_batch_size, o.model.context));
    }
    auto r = p.TrainStep(b);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    losses.push_back(r->loss);
  }
  return losses;
}

std::unique_ptr<InProcessPipeline> Make(const PipelineOptions& o) {
  auto p = InProcessPipeline::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(GpuStages, Fp32OnCudaMatchesTheCpu) {
  if (std::string why = WhyNoCuda(); !why.empty()) GTEST_SKIP() << why;
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const PipelineOptions cpu_o = Small(torch::kCPU, Precision::kFp32);
  const PipelineOptions gpu_o = Small(torch::Device(torch::kCUDA, 0), Precision::kFp32);
  auto cpu = Make(cpu_o);
  auto gpu = Make(gpu_o);
  ASSERT_TRUE(cpu && gpu);
  const std::vector<double> want = Train(*cpu, cpu_o, 20), got = Train(*gpu, gpu_o, 20);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LT(std::fabs(got[i] - want[i]) / want[i], 1e-4) << "step " << i << ": cuda " << got[i] << " cpu " << want[i];
  }
  EXPECT_LT(got.back(), got.front());
}

TEST(GpuStages, Bf16OnCudaTrains) {
  if (std::string why = WhyNoCuda(); !why.empty()) GTEST_SKIP() << why;
  const torch::Device device(torch::kCUDA, 0);
  PipelineOptions o = Small(device, Precision::kBf16);
  o.optimizer.total_steps = 30;
  auto p = Make(o);
  ASSERT_TRUE(p);
  const std::vector<double> l = Train(*p, o, 30);
  ASSERT_EQ(l.size(), 30u);
  double head = 0, tail = 0;
  for (int i = 0; i < 5; ++i) head += l[i] / 5, tail += l[25 + i] / 5;
  EXPECT_LT(tail, head - 0.5) << "bf16 on " << device << ": first 5 steps " << head << ", last 5 " << tail;
  // Master weights stay float32.
  for (const auto& kv : p->stage(1).model()->named_parameters()) EXPECT_EQ(kv.value().scalar_type(), torch::kFloat32);
}

TEST(GpuStages, ACheckpointWrittenOnTheGpuResumesOnTheCpu) {
  if (std::string why = WhyNoCuda(); !why.empty()) GTEST_SKIP() << why;
  const PipelineOptions gpu_o = Small(torch::Device(torch::kCUDA, 0), Precision::kFp32);
  const PipelineOptions cpu_o = Small(torch::kCPU, Precision::kFp32);
  auto gpu = Make(gpu_o);
  ASSERT_TRUE(gpu);
  Train(*gpu, gpu_o, 3);
  const std::string dir = ::testing::TempDir() + "/gpu-ck";
  std::filesystem::remove_all(dir);
  std::fprintf(stderr, "trained 3 steps on the GPU\n");
  absl::Status saved = gpu->SaveCheckpoint(dir);
  ASSERT_TRUE(saved.ok()) << saved;
  auto cpu = Make(cpu_o);
  ASSERT_TRUE(cpu);
  std::fprintf(stderr, "saved; loading on the CPU\n");
  absl::Status loaded_cpu = cpu->LoadCheckpoint(dir);
  ASSERT_TRUE(loaded_cpu.ok()) << loaded_cpu;
  std::fprintf(stderr, "loaded; comparing\n");
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(cpu->stage(s).step(), 3);
    auto a = gpu->stage(s).model()->named_parameters();
    auto b = cpu->stage(s).model()->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& kv : a) {
      const torch::Tensor* other = b.find(kv.key());
      ASSERT_NE(other, nullptr) << kv.key();
      EXPECT_TRUE(torch::equal(kv.value().cpu(), *other)) << "stage " << s << " " << kv.key();
    }
  }
  std::fprintf(stderr, "compared; the reverse\n");
  // And back: the CPU pipeline's checkpoint loads on the GPU.
  const std::string dir2 = dir + "-back";
  ASSERT_TRUE(cpu->SaveCheckpoint(dir2).ok());
  auto gpu2 = Make(gpu_o);
  ASSERT_TRUE(gpu2);
  absl::Status loaded = gpu2->LoadCheckpoint(dir2);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_TRUE(torch::equal(gpu2->stage(0).model()->named_parameters()["wte.weight"].cpu(),
                           cpu->stage(0).model()->named_parameters()["wte.weight"]));
}

// MixedLinear against the plain form (casts, torch::linear, autograd through the casts) on the GPU,
// at the shapes of a GPT-2-XL block's c_attn (float32 LayerNorm output in, bf16 out), attn c_proj
// (attention's bf16 output as its [B, T, heads, hd] view, the plain form's input made contiguous)
// and mlp c_proj (bf16 in, the float32 residual stream out) for one 1,024-token sequence: the same
// outputs and gradients, bit for bit, over two micro-batches' accumulation (tests/stage_runtime/
// mixed_linear_test.cc covers the other cases on the CPU).
TEST(GpuStages, MixedLinearMatchesThePlainFormOnCuda) {
  if (std::string why = WhyNoCuda(); !why.empty()) GTEST_SKIP() << why;
  struct Shape {
    int64_t in, out;
    torch::ScalarType x_dtype, out_dtype;
    int64_t heads;  // > 0: the input is attention's output, [1, heads, 1024, in / heads] transposed
  };
  const auto on = torch::TensorOptions().device(torch::kCUDA);
  for (const Shape& sh : {Shape{1600, 4800, torch::kFloat32, torch::kBFloat16, 0},
                          Shape{1600, 1600, torch::kBFloat16, torch::kFloat32, 25},
                          Shape{6400, 1600, torch::kBFloat16, torch::kFloat32, 0}}) {
    torch::manual_seed(3);
    const torch::Tensor w0 = torch::randn({sh.out, sh.in}, on) * 0.02, b0 = torch::randn({sh.out}, on) * 0.02;
    torch::Tensor w_ref = w0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    torch::Tensor b_ref = b0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    MixedLinearParams p{w, b, w.detach().to(torch::kBFloat16), b.detach().to(torch::kBFloat16)};
    for (int mb = 0; mb < 2; ++mb) {
      const torch::Tensor x0 = (sh.heads > 0 ? torch::randn({1, sh.heads, 1024, sh.in / sh.heads}, on)
                                             : torch::randn({1, 1024, sh.in}, on))
                                   .to(sh.x_dtype);
      const torch::Tensor dy = (torch::randn({1, 1024, sh.out}, on) * 0.01).to(sh.out_dtype);
      torch::Tensor x_ref = x0.clone().requires_grad_(true), x = x0.clone().requires_grad_(true);
      const torch::Tensor x_in = sh.heads > 0 ? x.transpose(1, 2) : x;
      const torch::Tensor x_ref_in = sh.heads > 0 ? x_ref.transpose(1, 2).contiguous().view({1, 1024, sh.in}) : x_ref;
      const torch::Tensor y_ref =
          torch::linear(x_ref_in.to(torch::kBFloat16), w_ref.to(torch::kBFloat16), b_ref.to(torch::kBFloat16)).to(sh.out_dtype);
      const torch::Tensor y = MixedLinear(x_in, p, sh.out_dtype);
      y_ref.backward(dy);
      y.backward(dy);
      EXPECT_TRUE(torch::equal(y, y_ref)) << sh.in << "x" << sh.out << ", micro-batch " << mb;
      EXPECT_TRUE(torch::equal(x.grad(), x_ref.grad())) << sh.in << "x" << sh.out << ", micro-batch " << mb;
      EXPECT_TRUE(torch::equal(w.grad(), w_ref.grad())) << sh.in << "x" << sh.out << ", micro-batch " << mb;
      EXPECT_TRUE(torch::equal(b.grad(), b_ref.grad())) << sh.in << "x" << sh.out << ", micro-batch " << mb;
    }
  }
}

}  // namespace
}  // namespace longhaul::stage_runtime
