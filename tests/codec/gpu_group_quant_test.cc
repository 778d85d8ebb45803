// int<k> and tahquant on a CUDA device: every payload byte-identical to the CPU scalar reference's,
// every decoded float bit-identical, over odd shapes, every group size, both bit allocations, fp32
// and bf16 input. Skipped (with the reason) without a GPU.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "codec/cpu/kernels.h"
#include "codec/cuda/gpu_codec.h"
#include "codec/group_quant.h"
#include "gtest/gtest.h"
#include "tests/codec/group_quant_cases.h"

namespace longhaul::codec {
namespace {

using gq_testing::Activations;
using gq_testing::Case;
using gq_testing::Cases;
using gq_testing::FromBf16;
using gq_testing::kShapes;
using gq_testing::Shape;
using gq_testing::ToBf16;

#define SKIP_WITHOUT_GPU()                          \
  do {                                              \
    std::string why;                                \
    if (!gpu::Available(&why)) GTEST_SKIP() << why; \
  } while (0)


class GpuGroupQuant : public ::testing::Test {
 protected:
  // Encodes `host` (already the float values the device sees) on the CPU and the device, compares
  // the payloads, then decodes the payload both ways and compares the floats.
  void Check(const std::vector<float>& host, const void* device_input, FrameDtype dtype, Shape s,
             const Case& c) {
    SCOPED_TRACE(::testing::Message() << c.name << " g=" << c.p.group_size << " bits=" << c.p.bits_hi << "/"
                                      << c.p.bits_lo << " shape=" << s.tokens << "x" << s.dim
                                      << " dtype=" << static_cast<int>(dtype));
    if (std::getenv("LONGHAUL_TEST_TRACE") != nullptr) {
      std::fprintf(stderr, "case %s g=%d bits=%d/%d shape=%lldx%lld dtype=%d\n", c.name, c.p.group_size, c.p.bits_hi,
                   c.p.bits_lo, static_cast<long long>(s.tokens), static_cast<long long>(s.dim), static_cast<int>(dtype));
    }
    std::string cpu;
    GroupQuantStats cpu_stats;
    ASSERT_TRUE(GroupQuantEncode(host.data(), s.tokens, s.dim, c.p, 1, ScalarKernels(), &cpu, &cpu_stats).ok());
    GroupQuantStats gpu_stats;
    const bool trace = std::getenv("LONGHAUL_TEST_TRACE") != nullptr;
    if (trace) std::fprintf(stderr, "  cpu encoded %zu bytes\n", cpu.size());
    absl::StatusOr<gpu::DeviceBytes> dev = gpu::GroupQuantEncode(device_input, dtype, s.tokens, s.dim, c.p, ws_,
                                                                 nullptr, &gpu_stats);
    ASSERT_TRUE(dev.ok()) << dev.status();
    if (trace) std::fprintf(stderr, "  gpu encoded %zu bytes\n", dev->size);
    std::string got;
    ASSERT_TRUE(gpu::AppendToHost(*dev, nullptr, &got).ok());
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(static_cast<uint8_t>(got[i]), static_cast<uint8_t>(cpu[i])) << "first differing payload byte " << i;
    }
    EXPECT_EQ(gpu_stats.transformed_groups, cpu_stats.transformed_groups);
    EXPECT_EQ(gpu_stats.tokens_hi, cpu_stats.tokens_hi);
    EXPECT_EQ(gpu_stats.groups, cpu_stats.groups);

    absl::StatusOr<GroupQuantLayout> layout = GroupQuantValidate(cpu, s.tokens, s.dim, c.p);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<float> want(s.tokens * s.dim);
    GroupQuantDecode(cpu, *layout, s.tokens, s.dim, c.p, 1, ScalarKernels(), want.data());
    absl::StatusOr<gpu::DeviceBuffer> pay = gpu::DeviceBuffer::Allocate(cpu.size());
    absl::StatusOr<gpu::DeviceBuffer> out = gpu::DeviceBuffer::Allocate(want.size() * sizeof(float));
    ASSERT_TRUE(pay.ok() && out.ok());
    ASSERT_TRUE(gpu::Upload(pay->data(), cpu.data(), cpu.size(), nullptr).ok());
    ASSERT_TRUE(gpu::GroupQuantDecode(static_cast<const uint8_t*>(pay->data()), *layout, s.tokens, s.dim, c.p,
                                      static_cast<float*>(out->data()), ws_, nullptr)
                    .ok());
    std::vector<float> dec(want.size());
    ASSERT_TRUE(gpu::Download(dec.data(), out->data(), dec.size() * sizeof(float), nullptr).ok());
    for (size_t i = 0; i < want.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &want[i], 4);
      std::memcpy(&b, &dec[i], 4);
      ASSERT_EQ(a, b) << "first differing decoded element " << i << ": " << want[i] << " vs " << dec[i];
    }
  }

  // Check for every case of fp32 input x.
  void CheckFp32(const std::vector<float>& x, Shape s) {
    absl::StatusOr<gpu::DeviceBuffer> dx = gpu::DeviceBuffer::Allocate(x.size() * sizeof(float));
    ASSERT_TRUE(dx.ok());
    ASSERT_TRUE(gpu::Upload(dx->data(), x.data(), x.size() * sizeof(float), nullptr).ok());
    for (const Case& c : Cases()) {
      Check(x, dx->data(), FrameDtype::kFloat32, s, c);
      if (HasFatalFailure()) return;
    }
  }

  gpu::Workspace ws_;
};

TEST_F(GpuGroupQuant, Fp32PayloadsAndDecodesMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    CheckFp32(Activations(s.tokens, s.dim, seed++), s);
    if (HasFatalFailure()) return;
  }
}

TEST_F(GpuGroupQuant, Bf16InputMatchesTheCpuEncodingOfTheSameValues) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    const std::vector<float> x = Activations(s.tokens, s.dim, seed++);
    std::vector<uint16_t> h(x.size());
    std::vector<float> widened(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      h[i] = ToBf16(x[i]);
      widened[i] = FromBf16(h[i]);
    }
    absl::StatusOr<gpu::DeviceBuffer> dx = gpu::DeviceBuffer::Allocate(h.size() * 2);
    ASSERT_TRUE(dx.ok());
    ASSERT_TRUE(gpu::Upload(dx->data(), h.data(), h.size() * 2, nullptr).ok());
    for (const Case& c : Cases()) {
      Check(widened, dx->data(), FrameDtype::kBFloat16, s, c);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(GpuGroupQuant, RejectsNonFiniteAndHugeInputNamingTheFirstToken) {
  SKIP_WITHOUT_GPU();
  const Shape s{40, 96};
  GroupQuantParams int8;  // the one-pass int<k> encoder checks its input its own way
  int8.bits_hi = int8.bits_lo = 8;
  int8.hadamard = false;
  for (const GroupQuantParams& p : {GroupQuantParams{}, int8}) {
    // Two bad tokens, then every token bad (fewer good tokens than the allocation's n_hi).
    for (const auto& [bad, every] : {std::pair{NAN, false}, std::pair{INFINITY, false}, std::pair{0x1p101f, false},
                                     std::pair{NAN, true}, std::pair{0x1p101f, true}}) {
      std::vector<float> x = Activations(s.tokens, s.dim, 7);
      x[23 * s.dim + 5] = bad;
      x[31 * s.dim + 1] = bad;
      for (int64_t t = 0; every && t < s.tokens; ++t) x[t * s.dim + 3] = bad;
      std::string cpu;
      const absl::Status want = GroupQuantEncode(x.data(), s.tokens, s.dim, p, 1, ScalarKernels(), &cpu, nullptr);
      ASSERT_FALSE(want.ok());
      absl::StatusOr<gpu::DeviceBuffer> dx = gpu::DeviceBuffer::Allocate(x.size() * sizeof(float));
      ASSERT_TRUE(dx.ok());
      ASSERT_TRUE(gpu::Upload(dx->data(), x.data(), x.size() * sizeof(float), nullptr).ok());
      absl::StatusOr<gpu::DeviceBytes> got = gpu::GroupQuantEncode(dx->data(), FrameDtype::kFloat32, s.tokens, s.dim,
                                                                   p, ws_, nullptr);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().message(), want.message());
    }
  }
}

// s.tokens rows of activations (seed), each repeated `run` times in a row: equal entropies in runs.
std::vector<float> RowsInRuns(const Shape& s, int64_t run, uint32_t seed) {
  const std::vector<float> base = Activations(s.tokens / run + 1, s.dim, seed);
  std::vector<float> x(s.tokens * s.dim);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::memcpy(&x[t * s.dim], &base[(t / run) * s.dim], s.dim * sizeof(float));
  }
  return x;
}

// More tokens than the allocation's tiles (256) and than its list of keys that share the selected
// key's top bits (4,096), with every row repeated in runs of 7 so that equal entropies straddle
// the tiles and the n_hi-th key: the ties go to the lower token index, as on the CPU.
TEST_F(GpuGroupQuant, ManyTokensWithTiedEntropiesAllocateAsTheCpu) {
  SKIP_WITHOUT_GPU();
  const Shape s{10007, 16};
  CheckFp32(RowsInRuns(s, 7, 11), s);
}

// More tokens than 1,024 tiles of 256 (the allocation's most): tiles of 512, each block's tokens
// in two steps (counts carried between them), rows repeated in runs of 5 so that equal keys
// straddle the steps and the tiles.
TEST_F(GpuGroupQuant, TilesOfSeveralStepsAllocateAsTheCpu) {
  SKIP_WITHOUT_GPU();
  const Shape s{300007, 8};
  CheckFp32(RowsInRuns(s, 5, 13), s);
}

// Every token the same row: one entropy shared by all 9,000 tokens, far more than the allocation's
// list takes, so kth and the counts before each tile come from every token's key; the n_hi tokens
// of lowest index are hi, as on the CPU.
TEST_F(GpuGroupQuant, OneEntropyForEveryTokenAllocatesAsTheCpu) {
  SKIP_WITHOUT_GPU();
  const Shape s{9000, 64};
  CheckFp32(RowsInRuns(s, s.tokens, 5), s);
}

// Tokens with 1 to 64 nonzero elements: entropies from 0 to 6 bits, keys that differ in their top
// 8 bits, so the allocation's first level stops at 16 bits (the other tests' entropies share
// them and it reads 24).
TEST_F(GpuGroupQuant, EntropiesOverSeveralOctavesAllocateAsTheCpu) {
  SKIP_WITHOUT_GPU();
  const Shape s{3001, 64};
  std::vector<float> x = Activations(s.tokens, s.dim, 9);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t i = 1 + t % s.dim; i < s.dim; ++i) x[t * s.dim + i] = 0.0f;
  }
  CheckFp32(x, s);
}

// TAH-Quant's encode returns once the allocation has announced its payload's size, its encode
// kernel still running (gpu_codec.h). Each call here is queued right behind the previous call of
// another size on the same stream and workspace (whose encode may still run), and one behind a
// failing call (NaN input): every size, statistic and byte is the call's own, not the previous
// call's results left in the pinned area.
TEST_F(GpuGroupQuant, BackToBackEncodesEachGetTheirOwnResults) {
  SKIP_WITHOUT_GPU();
  const GroupQuantParams p;  // tahquant's defaults
  const std::vector<Shape> shapes = {{4096, 512}, {33, 257}, {4096, 512}, {1000, 64}};
  std::vector<std::vector<float>> xs;
  std::vector<gpu::DeviceBuffer> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    xs.push_back(Activations(shapes[i].tokens, shapes[i].dim, 40 + static_cast<uint32_t>(i)));
    if (i == 3) xs[i][17 * shapes[i].dim + 3] = NAN;  // the failing call's input
    absl::StatusOr<gpu::DeviceBuffer> dx = gpu::DeviceBuffer::Allocate(xs[i].size() * sizeof(float));
    ASSERT_TRUE(dx.ok());
    ASSERT_TRUE(gpu::Upload(dx->data(), xs[i].data(), xs[i].size() * sizeof(float), nullptr).ok());
    inputs.push_back(std::move(*dx));
  }
  auto encode = [&](size_t i, GroupQuantStats* st) {
    return gpu::GroupQuantEncode(inputs[i].data(), FrameDtype::kFloat32, shapes[i].tokens, shapes[i].dim, p, ws_,
                                 nullptr, st);
  };
  // (previous call, call): a large one then a small one, small then large, failing then large.
  using Calls = std::pair<size_t, size_t>;
  for (const auto& [before, i] : {Calls{0, 1}, Calls{1, 2}, Calls{3, 0}}) {
    SCOPED_TRACE(::testing::Message() << "call " << i << " behind call " << before);
    absl::StatusOr<gpu::DeviceBytes> first = encode(before, nullptr);
    if (before == 3) {
      ASSERT_FALSE(first.ok());
      EXPECT_EQ(first.status().message(), "input has a NaN or Inf in token 17");
    } else {
      ASSERT_TRUE(first.ok()) << first.status();
    }
    GroupQuantStats got_stats, want_stats;
    absl::StatusOr<gpu::DeviceBytes> got = encode(i, &got_stats);
    ASSERT_TRUE(got.ok()) << got.status();
    std::string want;
    ASSERT_TRUE(GroupQuantEncode(xs[i].data(), shapes[i].tokens, shapes[i].dim, p, 1, ScalarKernels(), &want,
                                 &want_stats)
                    .ok());
    EXPECT_EQ(got->size, want.size());
    EXPECT_EQ(got_stats.transformed_groups, want_stats.transformed_groups);
    EXPECT_EQ(got_stats.tokens_hi, want_stats.tokens_hi);
    std::string bytes;
    ASSERT_TRUE(gpu::AppendToHost(*got, nullptr, &bytes).ok());
    ASSERT_TRUE(bytes == want) << "payloads of " << bytes.size() << " and " << want.size() << " bytes differ";
  }
}

TEST_F(GpuGroupQuant, EmptyTensorsGiveEmptyPayloads) {
  SKIP_WITHOUT_GPU();
  for (Shape s : {Shape{0, 64}, Shape{5, 0}}) {
    absl::StatusOr<gpu::DeviceBytes> got = gpu::GroupQuantEncode(nullptr, FrameDtype::kFloat32, s.tokens, s.dim,
                                                                 GroupQuantParams{}, ws_, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->size, 0u);
  }
}

}  // namespace
}  // namespace longhaul::codec
