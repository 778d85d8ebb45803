// Round trips, error bounds (named tolerances), scalar-vs-SIMD frame identity, and the TAH-Quant
// claims on synthetic LLM-like activations.
#include "codec/codec.h"

#include <gtest/gtest.h>

#include "bench/synthetic_data.h"
#include "codec/group_quant.h"

namespace longhaul::codec {
namespace {

// Relative L2 error bounds on Gaussian data (measured values are about 60% of these).
constexpr double kFp16RelL2 = 1e-3;
constexpr double kBf16RelL2 = 8e-3;
constexpr double kInt8RelL2 = 0.01;
constexpr double kInt4RelL2 = 0.12;
constexpr double kTahQuantGaussianRelL2 = 0.16;

double RelL2(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / a.to(torch::kFloat64).norm())
      .item<double>();
}

torch::Tensor Activations(int64_t tokens, int64_t hidden, uint64_t seed = 1, int outliers = 4) {
  bench::ActivationSpec s;
  s.tokens = tokens;
  s.hidden = hidden;
  s.seed = seed;
  s.outlier_channels = outliers;
  auto v = bench::SyntheticActivations(s);
  return torch::from_blob(v.data(), {tokens, hidden}, torch::kFloat32).clone();
}

std::unique_ptr<Codec> Make(const std::string& spec) {
  auto c = MakeCodec(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

torch::Tensor RoundTrip(const std::string& spec, const torch::Tensor& x, EncodeOptions eo = {},
                        DecodeOptions dopt = {}) {
  auto frame = Make(spec)->Encode(x, eo);
  EXPECT_TRUE(frame.ok()) << frame.status();
  auto y = DecodeFrame(*frame, dopt);
  EXPECT_TRUE(y.ok()) << y.status();
  return *y;
}

struct BoundCase {
  const char* spec;
  double bound;
};

class GaussianRoundTrip : public ::testing::TestWithParam<BoundCase> {};

TEST_P(GaussianRoundTrip, ShapeDtypeAndError) {
  const torch::Tensor x = torch::randn({4, 33, 256}, torch::TensorOptions().dtype(torch::kFloat32));
  const torch::Tensor y = RoundTrip(GetParam().spec, x);
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), torch::kFloat32);
  EXPECT_LE(RelL2(x, y), GetParam().bound) << GetParam().spec;
}

INSTANTIATE_TEST_SUITE_P(
    AllCodecs, GaussianRoundTrip,
    ::testing::Values(BoundCase{"fp32", 0.0}, BoundCase{"fp16", kFp16RelL2},
                      BoundCase{"bf16", kBf16RelL2}, BoundCase{"int8:g=64", kInt8RelL2},
                      BoundCase{"int8:g=128", kInt8RelL2}, BoundCase{"int4:g=32", kInt4RelL2},
                      BoundCase{"tahquant", kTahQuantGaussianRelL2},
                      BoundCase{"tahquant:g=32", kTahQuantGaussianRelL2}),
    [](const auto& info) {
      std::string n = info.param.spec;
      for (char& c : n) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

TEST(Codec, KeepsHalfPrecisionInputDtype) {
  const torch::Tensor x = torch::randn({8, 64}).to(torch::kBFloat16);
  for (const char* spec : {"fp32", "fp16", "bf16", "int6", "tahquant"}) {
    const torch::Tensor y = RoundTrip(spec, x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16) << spec;
  }
}

TEST(Codec, IntKElementErrorWithinHalfAStep) {
  // Per element: |x - x^| <= step / 2, step <= (range * (1 + 2^-6) + |lo| * 2^-6) / (2^k - 1)
  // (mf12 rounds the scale up and lo down by at most one 6-bit mantissa step).
  const torch::Tensor x = torch::randn({16, 128}) * 3 + 1;
  for (int k = 2; k <= 8; ++k) {
    const torch::Tensor y = RoundTrip("int" + std::to_string(k) + ":g=32", x);
    auto xa = x.accessor<float, 2>();
    auto ya = y.accessor<float, 2>();
    for (int t = 0; t < 16; ++t) {
      for (int g = 0; g < 4; ++g) {
        float lo = 1e30f, hi = -1e30f;
        for (int i = 0; i < 32; ++i) lo = std::min(lo, xa[t][g * 32 + i]), hi = std::max(hi, xa[t][g * 32 + i]);
        const float step = ((hi - lo) * (1 + 1 / 64.f) + std::fabs(lo) / 64.f) / ((1 << k) - 1);
        for (int i = 0; i < 32; ++i) {
          ASSERT_LE(std::fabs(xa[t][g * 32 + i] - ya[t][g * 32 + i]), 0.5f * step * 1.001f + 1e-6f)
              << "k=" << k;
        }
      }
    }
  }
}

TEST(Codec, EdgeShapes) {
  for (auto shape : std::vector<std::vector<int64_t>>{{}, {0}, {3, 0}, {1}, {7}, {5, 100}, {2, 3, 70}}) {
    const torch::Tensor x = torch::randn(shape);
    for (const char* spec : {"fp32", "bf16", "int4", "tahquant:g=32"}) {
      const torch::Tensor y = RoundTrip(spec, x);
      EXPECT_EQ(y.sizes(), x.sizes()) << spec;
      if (x.numel() > 0) {
        EXPECT_LE(RelL2(x, y), 0.5) << spec;
      }
    }
  }
}

TEST(Codec, ConstantAndZeroTensors) {
  for (float c : {0.0f, 3.0f, -1e-20f}) {
    const torch::Tensor x = torch::full({4, 64}, c);
    const torch::Tensor y = RoundTrip("tahquant", x);
    EXPECT_LE((x - y).abs().max().item<float>(), std::fabs(c) / 32 + 1e-30f) << c;
  }
}

TEST(Codec, RejectsNonFiniteAndHugeInput) {
  torch::Tensor x = torch::randn({4, 64});
  x[2][5] = std::numeric_limits<float>::quiet_NaN();
  auto f = Make("tahquant")->Encode(x);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("NaN or Inf in token 2"), std::string::npos) << f.status();
  x[2][5] = 1e35f;
  EXPECT_FALSE(Make("int8")->Encode(x).ok());
  EXPECT_FALSE(Make("fp32")->Encode(torch::ones({3}, torch::kInt64)).ok());
}

TEST(Codec, SpecsParseAndPrintCanonically) {
  EXPECT_EQ(Make("int4")->spec(), "int4:g=64");
  EXPECT_EQ(Make("tahquant:g=32,hadamard=off")->spec(),
            "tahquant:g=32,r=0.8,tau=2,bits=4/3,hadamard=off,adaptive=on");
  for (const char* bad : {"", "int9", "int1", "int4:g=48", "int4:g=512", "tahquant:r=1.5",
                          "tahquant:tau=-1", "tahquant:bits=3/4", "tahquant:foo=1", "fp32:g=4",
                          "zstd", "tahquant:hadamard=maybe", "int4:r=0.5"}) {
    EXPECT_FALSE(MakeCodec(bad).ok()) << bad;
  }
}

// The SIMD path must write the same bytes as the scalar reference, and decode to the same bits.
TEST(Codec, ScalarAndSimdFramesAreIdentical) {
  if (Avx2Kernels() == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  const torch::Tensor x = Activations(300, 520, 3);  // 520: partial last group
  for (const char* spec : {"int2", "int3", "int4", "int5:g=8", "int8:g=128", "tahquant",
                           "tahquant:g=32,bits=6/4", "tahquant:hadamard=off"}) {
    auto c = Make(spec);
    auto a = c->Encode(x, {1, &ScalarKernels()});
    auto b = c->Encode(x, {1, Avx2Kernels()});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(*a, *b) << spec;
    auto ya = DecodeFrame(*a, {1, &ScalarKernels()});
    auto yb = DecodeFrame(*a, {1, Avx2Kernels()});
    ASSERT_TRUE(ya.ok() && yb.ok());
    ASSERT_TRUE(torch::equal(*ya, *yb)) << spec;
  }
}

TEST(Codec, ThreadCountDoesNotChangeTheFrame) {
  const torch::Tensor x = Activations(257, 256, 4);
  auto c = Make("tahquant");
  auto a = c->Encode(x, {1});
  auto b = c->Encode(x, {3});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  auto ya = DecodeFrame(*a, {1});
  auto yb = DecodeFrame(*a, {4});
  EXPECT_TRUE(torch::equal(*ya, *yb));
}

double BitsPerElement(const std::string& frame, int64_t numel) { return frame.size() * 8.0 / numel; }

// The paper's claim on outlier-heavy activations: fewer bits and less error than INT4 with the same
// group size; each ablation is worse than the full method. Data: the benchmark's default generator
// (4 outlier channels in 2048, seed 1), fewer tokens. docs/codec-results.md shows where the claim
// stops holding (outlier channels colliding in one group defeat the single-pivot test).
TEST(TahQuant, BeatsInt4AndEveryAblationOnOutlierHeavyData) {
  const torch::Tensor x = Activations(1024, 2048, 1, 4);
  auto err = [&](const std::string& spec, double* bits) {
    auto f = Make(spec)->Encode(x);
    EXPECT_TRUE(f.ok());
    *bits = BitsPerElement(*f, x.numel());
    return RelL2(x, *DecodeFrame(*f));
  };
  double b_tah, b_int4, b_noh, b_noa;
  const double e_tah = err("tahquant:g=64,r=0.8", &b_tah);
  const double e_int4 = err("int4:g=64", &b_int4);
  const double e_noh = err("tahquant:g=64,r=0.8,hadamard=off", &b_noh);
  const double e_noa = err("tahquant:g=64,r=0.8,adaptive=off", &b_noa);
  EXPECT_LE(b_tah, 4.3);
  EXPECT_LT(b_tah, b_int4);
  EXPECT_LT(e_tah, e_int4);
  EXPECT_LT(e_tah, e_noh);
  EXPECT_LT(e_tah, e_noa);
  EXPECT_NEAR(b_noa, b_tah, 0.05);  // same bit budget, different allocation
}

TEST(TahQuant, StatsCountTransformsAndHighBitTokens) {
  const torch::Tensor x = Activations(100, 256, 2, 4);
  EncodeStats st;
  ASSERT_TRUE(Make("tahquant:r=0.75")->Encode(x, {}, &st).ok());
  EXPECT_EQ(st.tokens_hi, 75);
  EXPECT_EQ(st.groups, 400);
  EXPECT_GT(st.transformed_groups, 0);
  EncodeStats none;
  ASSERT_TRUE(Make("tahquant:hadamard=off")->Encode(x, {}, &none).ok());
  EXPECT_EQ(none.transformed_groups, 0);
}

// --- where codecs run (CodecDevice). The GPU paths themselves run on a GPU machine
// (tests/codec/gpu_*); here: parsing, the choice, and the errors and fallbacks without a GPU. ---

TEST(CodecDevice, ParsesAndNames) {
  for (CodecDevice d : {CodecDevice::kAuto, CodecDevice::kCpu, CodecDevice::kGpu}) {
    absl::StatusOr<CodecDevice> p = ParseCodecDevice(CodecDeviceName(d));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, d);
  }
  EXPECT_EQ(std::string(CodecDeviceName(CodecDevice::kGpu)), "gpu");
  for (const char* bad : {"", "GPU", "cuda", "cuda:0", "auto "}) {
    absl::StatusOr<CodecDevice> p = ParseCodecDevice(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("is not auto, cpu or gpu"), std::string::npos) << p.status();
  }
}

// CPU tensors: kAuto and kCpu write the CPU's frame; kGpu is refused, naming the tensor's device,
// for every family (so a job asking for GPU codecs never silently runs them on the CPU).
TEST(CodecDevice, CpuTensorsUseTheCpuAndRefuseGpu) {
  const torch::Tensor x = Activations(33, 96, 5);
  for (const char* spec : {"fp32", "bf16", "int4", "tahquant", "sdp4bit-tlqhs", "bitdp2"}) {
    auto c = Make(spec);
    auto ref = c->Encode(x);
    ASSERT_TRUE(ref.ok()) << spec << ": " << ref.status();
    for (CodecDevice d : {CodecDevice::kAuto, CodecDevice::kCpu}) {
      EncodeOptions o;
      o.device = d;
      auto f = c->Encode(x, o);
      ASSERT_TRUE(f.ok()) << spec << ": " << f.status();
      EXPECT_EQ(*f, *ref) << spec;
      auto parts = c->EncodeParts(x, o);
      ASSERT_TRUE(parts.ok()) << spec;
      EXPECT_EQ(parts->Join(), *ref) << spec;
    }
    EncodeOptions gpu;
    gpu.device = CodecDevice::kGpu;
    for (auto f : {c->Encode(x, gpu), [&]() -> absl::StatusOr<std::string> {
                     auto p = c->EncodeParts(x, gpu);
                     if (!p.ok()) return p.status();
                     return p->Join();
                   }()}) {
      ASSERT_FALSE(f.ok()) << spec;
      EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition) << spec;
      EXPECT_NE(f.status().message().find("codec device gpu: the tensor is on cpu"), std::string::npos)
          << f.status();
    }
  }
}

// The raw codecs' Encode is EncodeParts joined, including the casts (fp32 -> bf16/fp16 and back).
TEST(CodecDevice, RawEncodeEqualsItsParts) {
  for (torch::ScalarType t : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const torch::Tensor x = torch::randn({5, 7}).to(t);
    for (const char* spec : {"fp32", "fp16", "bf16"}) {
      auto c = Make(spec);
      auto f = c->Encode(x);
      auto p = c->EncodeParts(x);
      ASSERT_TRUE(f.ok() && p.ok()) << spec;
      EXPECT_EQ(*f, p->Join()) << spec;
      auto y = DecodeFrame(*f);
      ASSERT_TRUE(y.ok());
      EXPECT_EQ(y->scalar_type(), t) << spec;
    }
  }
}

// Decoding: an explicit CPU target is the plain decode (and reuses the output buffer); kGpu needs a
// CUDA target; without the GPU codecs (this build machine) kGpu to a CUDA device says why.
TEST(CodecDevice, DecodeTargets) {
  const torch::Tensor x = Activations(20, 64, 6);
  auto frame = Make("int8")->Encode(x);
  ASSERT_TRUE(frame.ok());
  auto ref = DecodeFrame(*frame);
  ASSERT_TRUE(ref.ok());

  DecodeOptions cpu;
  cpu.device = torch::Device(torch::kCPU);
  torch::Tensor out = torch::empty({20, 64});
  const void* storage = out.data_ptr();
  ASSERT_TRUE(DecodeFrameInto(*frame, &out, cpu).ok());
  EXPECT_EQ(out.data_ptr(), storage);
  EXPECT_TRUE(torch::equal(out, *ref));
  for (CodecDevice d : {CodecDevice::kAuto, CodecDevice::kCpu}) {
    cpu.codec_device = d;
    auto y = DecodeFrame(*frame, cpu);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(y->device().is_cpu());
    EXPECT_TRUE(torch::equal(*y, *ref));
  }

  for (const std::optional<torch::Device>& target :
       {std::optional<torch::Device>(), std::optional<torch::Device>(torch::Device(torch::kCPU))}) {
    DecodeOptions g;
    g.device = target;
    g.codec_device = CodecDevice::kGpu;
    auto y = DecodeFrame(*frame, g);
    ASSERT_FALSE(y.ok());
    EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(y.status().message().find("decoding on a GPU needs a CUDA target device"), std::string::npos)
        << y.status();
  }

  std::string why;
  if (GpuCodecsAvailable(&why)) GTEST_SKIP() << "this machine has the GPU codecs (tests/codec/gpu_*)";
  EXPECT_FALSE(why.empty());
  DecodeOptions g;
  g.device = torch::Device(torch::kCUDA, 0);
  g.codec_device = CodecDevice::kGpu;
  auto y = DecodeFrame(*frame, g);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(y.status().message().find("the GPU codecs are not available: " + why), std::string::npos) << y.status();
  // kAuto falls back to the CPU decode and a copy to the device, which this LibTorch may not have:
  // then the error is LibTorch's, not the codec's.
  g.codec_device = CodecDevice::kAuto;
  auto a = DecodeFrame(*frame, g);
  if (a.ok()) {
    EXPECT_TRUE(a->is_cuda());
    EXPECT_TRUE(torch::equal(a->cpu(), *ref));
  } else {
    EXPECT_EQ(a.status().message().find("codec device"), std::string::npos) << a.status();
  }
}

}  // namespace
}  // namespace longhaul::codec
