// The GPU grouped-quantisation encoder without a GPU: the per-group arithmetic and the block phases
// of codec/cuda/group_quant_group.h, run on the host thread after thread in the order the kernels'
// barriers impose (shared memory starting as garbage), with the scans done here, must give the CPU
// reference's payload byte for byte. Token bit widths and exponents (TokenStats and the sort on the
// device) are read from the CPU payload's block headers. gpu_group_quant_test.cc checks the kernels
// themselves on a GPU.
#include "codec/cuda/group_quant_group.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/cpu/kernels.h"
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

// Below 1, tau flags groups whose maximum repeats (the pivot is then the first of them).
constexpr float kTiesTau = 0.5f;


struct HostLoad {
  const float* x;
  float operator()(int64_t i) const { return x[i]; }
};

// Shared memory as a block finds it: garbage (NaN floats, offsets and counts of -1).
template <typename S>
std::unique_ptr<S> Garbage() {
  auto s = std::make_unique<S>();
  std::memset(static_cast<void*>(s.get()), 0xFF, sizeof(S));
  return s;
}

// TokenStats and the bit allocation's results, taken from the CPU payload's block headers.
std::vector<gpu::TokenInfo> InfoFromPayload(const std::string& payload, const GroupQuantLayout& layout,
                                            int64_t tokens) {
  std::vector<gpu::TokenInfo> info(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const auto* blk = reinterpret_cast<const uint8_t*>(payload.data()) + layout.token_offset[t];
    info[t] = gpu::TokenInfo{0.0f, static_cast<int8_t>(blk[1]), blk[0], 1, 0, 0};
  }
  return info;
}

struct Emulated {
  std::string payload;
  int64_t transformed = 0;
};

// group_quant.cu's GroupQuantEncode from the flags on: GroupFlags, the exclusive scan, BlockSizes,
// the inclusive scan and EncodeGroups, every kernel as its blocks' threads running each phase in
// turn. Bytes no thread writes keep `fill`.
template <int G>
Emulated EmulateEncode(const float* x, int64_t tokens, int64_t dim, const GroupQuantParams& p,
                       std::vector<gpu::TokenInfo> info, char fill) {
  using Geo = gpu::GroupGeometry<G>;
  const int ng = static_cast<int>((dim + G - 1) / G);
  const int64_t groups = tokens * ng;
  const int64_t blocks = (groups + Geo::kGroups - 1) / Geo::kGroups;
  const HostLoad load{x};
  Emulated e;
  std::vector<int32_t> flag, ordinal;
  std::vector<uint8_t> pivot;
  if (p.hadamard) {
    flag.assign(groups, -7);  // every entry must be written
    pivot.assign(groups, 0xEE);
    for (int64_t b = 0; b < blocks; ++b) {
      auto sm = Garbage<gpu::StageSmem<G>>();
      std::vector<int64_t> k(Geo::kGroups);
      for (int tid = 0; tid < Geo::kGroups; ++tid) k[tid] = gpu::FlagSetup<G>(*sm, b, tid, groups, ng, dim);
      for (int tid = 0; tid < Geo::kGroups; ++tid) gpu::StageGroups<G>(*sm, tid, load);
      for (int tid = 0; tid < Geo::kGroups; ++tid) {
        gpu::FlagSlot<G>(*sm, tid, k[tid], groups, p.tau, flag.data(), pivot.data());
      }
    }
    ordinal.resize(groups);
    int32_t run = 0;
    for (int64_t k = 0; k < groups; ++k) {
      EXPECT_TRUE(flag[k] == 0 || flag[k] == 1) << "group " << k;
      ordinal[k] = run;
      run += flag[k];
    }
    e.transformed = ordinal.back() + flag.back();
  }
  const int32_t* fp = p.hadamard ? flag.data() : nullptr;
  const int32_t* op = p.hadamard ? ordinal.data() : nullptr;
  std::vector<unsigned long long> ends(tokens);
  unsigned long long total = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    total += gpu::TokenBlockBytes(&info[t], t, dim, ng, fp, op);
    ends[t] = total;
  }
  e.payload.assign(total, fill);
  const gpu::EncodeArgs a{tokens, dim, ng, HadamardNorm(G), info.data(), ends.data(), fp, op,
                          p.hadamard ? pivot.data() : nullptr, reinterpret_cast<uint8_t*>(e.payload.data())};
  for (int64_t b = 0; b < blocks; ++b) {
    auto sm = Garbage<gpu::EncodeSmem<G>>();
    std::vector<gpu::SlotState> st(Geo::kGroups);
    for (int tid = 0; tid < Geo::kGroups; ++tid) st[tid] = gpu::EncodeSetup<G>(a, sm->stage, b, tid);
    for (int tid = 0; tid < Geo::kGroups; ++tid) gpu::StageGroups<G>(sm->stage, tid, load);
    for (int tid = 0; tid < Geo::kGroups; ++tid) gpu::EncodeSlot<G>(a, *sm, st[tid], tid);
    for (int tid = 0; tid < Geo::kGroups; ++tid) gpu::WriteCodes<G>(*sm, tid, a.payload);
  }
  return e;
}

Emulated Emulate(const float* x, int64_t tokens, int64_t dim, const GroupQuantParams& p,
                 std::vector<gpu::TokenInfo> info, char fill = 0) {
  switch (p.group_size) {
    case 8: return EmulateEncode<8>(x, tokens, dim, p, std::move(info), fill);
    case 16: return EmulateEncode<16>(x, tokens, dim, p, std::move(info), fill);
    case 32: return EmulateEncode<32>(x, tokens, dim, p, std::move(info), fill);
    case 64: return EmulateEncode<64>(x, tokens, dim, p, std::move(info), fill);
    case 128: return EmulateEncode<128>(x, tokens, dim, p, std::move(info), fill);
    case 256: return EmulateEncode<256>(x, tokens, dim, p, std::move(info), fill);
  }
  ADD_FAILURE() << "group size " << p.group_size;
  return {};
}

void ExpectSameBytes(const std::string& got, const std::string& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<uint8_t>(got[i]), static_cast<uint8_t>(want[i])) << "first differing payload byte " << i;
  }
}

void CheckAgainstCpu(const std::vector<float>& x, Shape s, const Case& c, const char* input) {
  SCOPED_TRACE(::testing::Message() << c.name << " g=" << c.p.group_size << " bits=" << c.p.bits_hi << "/"
                                    << c.p.bits_lo << " tau=" << c.p.tau << " shape=" << s.tokens << "x" << s.dim
                                    << " " << input);
  std::string cpu;
  GroupQuantStats stats;
  ASSERT_TRUE(GroupQuantEncode(x.data(), s.tokens, s.dim, c.p, 1, ScalarKernels(), &cpu, &stats).ok());
  absl::StatusOr<GroupQuantLayout> layout = GroupQuantValidate(cpu, s.tokens, s.dim, c.p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const Emulated e = Emulate(x.data(), s.tokens, s.dim, c.p, InfoFromPayload(cpu, *layout, s.tokens));
  ExpectSameBytes(e.payload, cpu);
  EXPECT_EQ(e.transformed, stats.transformed_groups);
}

TEST(GpuGroupQuantEmulation, Fp32PayloadsMatchTheCpuReference) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const std::vector<float> x = Activations(s.tokens, s.dim, seed++);
    for (const Case& c : Cases(kTiesTau)) {
      CheckAgainstCpu(x, s, c, "fp32");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(GpuGroupQuantEmulation, Bf16ValuesMatchTheCpuReference) {
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    std::vector<float> x = Activations(s.tokens, s.dim, seed++);
    for (float& v : x) v = FromBf16(ToBf16(v));
    for (const Case& c : Cases(kTiesTau)) {
      CheckAgainstCpu(x, s, c, "bf16 values");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The device encoder fails for a NaN/Inf/huge token; until the host sees that, the kernels still
// run, and must leave the bad token's block alone without disturbing anyone else's.
TEST(GpuGroupQuantEmulation, BadTokensAreSkippedWithoutTouchingOtherBlocks) {
  const Shape s{33, 257};
  const std::vector<float> x = Activations(s.tokens, s.dim, 5);
  for (const Case& c : Cases(kTiesTau)) {
    SCOPED_TRACE(::testing::Message() << c.name << " g=" << c.p.group_size);
    std::string cpu;
    ASSERT_TRUE(GroupQuantEncode(x.data(), s.tokens, s.dim, c.p, 1, ScalarKernels(), &cpu, nullptr).ok());
    absl::StatusOr<GroupQuantLayout> layout = GroupQuantValidate(cpu, s.tokens, s.dim, c.p);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<gpu::TokenInfo> info = InfoFromPayload(cpu, *layout, s.tokens);
    const std::vector<int64_t> bad = {0, 12, s.tokens - 1};
    for (int64_t t : bad) info[t].ok = 0;
    const char kFill = static_cast<char>(0xAA);
    const Emulated e = Emulate(x.data(), s.tokens, s.dim, c.p, info, kFill);
    std::string want = cpu;
    for (int64_t t : bad) {
      std::fill(want.begin() + layout->token_offset[t], want.begin() + layout->token_offset[t + 1], kFill);
    }
    ExpectSameBytes(e.payload, want);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The outlier test against the CPU's (Top2Abs, rho, the first index of the maximum) on groups full
// of ties, for every group size, and -1 for partial groups.
template <int G>
void CheckOutlierPivot(std::mt19937& rng) {
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> v(G);
  for (int trial = 0; trial < 200; ++trial) {
    for (float& a : v) a = static_cast<float>(small(rng)) * (trial % 2 ? 1.0f : 0.25f);
    if (trial % 3 == 0) v[rng() % G] = 40.0f * (trial % 2 ? 1.0f : -1.0f);
    for (float tau : {0.5f, 1.0f, 1.05f, 2.0f, 100.0f}) {
      float a1, a2;
      ScalarKernels().top2_abs(v.data(), G, &a1, &a2);
      int want = -1;
      if (IsOutlierGroup(a1, a2, tau)) {
        want = 0;
        while (std::fabs(v[want]) != a1) ++want;
      }
      ASSERT_EQ(gpu::OutlierPivot<G>(v.data(), G, tau), want) << "G=" << G << " trial " << trial << " tau " << tau;
      ASSERT_EQ(gpu::OutlierPivot<G>(v.data(), G - 1, tau), -1);
    }
  }
}

TEST(GpuGroupQuantEmulation, OutlierPivotIsTheCpuTest) {
  std::mt19937 rng(3);
  CheckOutlierPivot<8>(rng);
  CheckOutlierPivot<16>(rng);
  CheckOutlierPivot<32>(rng);
  CheckOutlierPivot<64>(rng);
  CheckOutlierPivot<128>(rng);
  CheckOutlierPivot<256>(rng);
}

// The kernels encode groups of up to 64 through a register copy and larger ones in place; both
// variants must agree for every size, so that the payload tests above (each size through its own
// variant) cover both.
template <int G>
void CheckVariantsAgree(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float norm = HadamardNorm(G);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> v(G);
    for (float& a : v) a = normal(rng) * (trial % 5 == 0 ? 1e-30f : 3.0f);
    const int n = trial % 4 == 0 ? 1 + static_cast<int>(rng() % G) : G;
    const int pivot = n == G && trial % 2 ? static_cast<int>(rng() % G) : -1;
    const int bits = 2 + trial % 7;
    const int exp = 4 + trial % 3 - (trial % 5 == 0 ? 100 : 0);
    uint8_t p1[3], p2[3];
    std::vector<uint8_t> c1(G, 0x11), c2(G, 0x11);
    gpu::EncodeGroup<G>(v.data(), n, exp, bits, pivot, norm, p1, c1.data());
    std::vector<float> w = v;
    gpu::EncodeGroupInPlace<G>(w.data(), n, exp, bits, pivot, norm, p2, c2.data());
    ASSERT_EQ(std::memcmp(p1, p2, 3), 0) << "G=" << G << " trial " << trial;
    ASSERT_EQ(c1, c2) << "G=" << G << " trial " << trial;
    // Exactly ceil(n * bits / 8) code bytes written.
    const int64_t nb = PackedBytes(n, bits);
    for (int64_t i = nb; i < G; ++i) ASSERT_EQ(c1[i], 0x11) << "G=" << G << " trial " << trial << " byte " << i;
  }
}

TEST(GpuGroupQuantEmulation, RegisterAndInPlaceGroupsAgree) {
  std::mt19937 rng(4);
  CheckVariantsAgree<8>(rng);
  CheckVariantsAgree<16>(rng);
  CheckVariantsAgree<32>(rng);
  CheckVariantsAgree<64>(rng);
  CheckVariantsAgree<128>(rng);
  CheckVariantsAgree<256>(rng);
}

}  // namespace
}  // namespace longhaul::codec
