// Every optimised kernel against the scalar reference, bit for bit; and the scalar reference
// against the mathematical definition, within named tolerances.
#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace longhaul::codec {
namespace {

constexpr float kLog2ApproxTolerance = 2e-4f;  // FastLog2 polynomial, absolute, in bits

std::vector<float> RandomFloats(int n, uint32_t seed, float outlier = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  if (outlier != 0.0f && n > 0) v[rng() % n] = outlier;
  return v;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

class KernelsVsScalar : public ::testing::Test {
 protected:
  void SetUp() override {
    fast_ = Avx2Kernels();
    if (fast_ == nullptr) GTEST_SKIP() << "this CPU has no AVX2; nothing to compare";
  }
  const Kernels& ref_ = ScalarKernels();
  const Kernels* fast_ = nullptr;
};

TEST_F(KernelsVsScalar, AbsSumMax) {
  for (int n : {0, 1, 7, 8, 9, 63, 64, 1000, 2048, 2051}) {
    auto v = RandomFloats(n, n + 1, 30.0f);
    float s1, m1, s2, m2;
    ref_.abs_sum_max(v.data(), n, &s1, &m1);
    fast_->abs_sum_max(v.data(), n, &s2, &m2);
    ASSERT_TRUE(SameBits(s1, s2)) << n;
    ASSERT_TRUE(SameBits(m1, m2)) << n;
  }
}

// Every lane count the reduction meets: below one run of 8, between the compaction's steps, one
// and several rows of 2048 lanes, ragged tails; zeros (whose terms are -0) and subnormals included.
TEST_F(KernelsVsScalar, TokenSums) {
  for (int n : {1, 5, 8, 9, 31, 33, 64, 65, 100, 513, 768, 2047, 2048, 2049, 4096, 4103, 12289}) {
    for (bool alog : {false, true}) {
      auto v = RandomFloats(n, n + 3, 30.0f);
      if (n > 4) v[1] = 0.0f, v[2] = -0.0f, v[3] = 1e-40f;
      TokenSums a, b;
      ref_.token_sums(v.data(), n, alog, &a);
      fast_->token_sums(v.data(), n, alog, &b);
      ASSERT_TRUE(SameBits(a.sum, b.sum) && SameBits(a.max, b.max) && SameBits(a.alog, b.alog))
          << n << " alog " << alog << ": " << a.sum << " " << b.sum << " " << a.alog << " " << b.alog;
    }
  }
}

TEST_F(KernelsVsScalar, Top2MinMax) {
  for (int n : {8, 16, 32, 64, 128, 256, 12}) {
    for (uint32_t seed = 0; seed < 50; ++seed) {
      auto v = RandomFloats(n, seed, seed % 2 ? 10.0f : 0.0f);
      if (seed % 5 == 0) v[n - 1] = v[0];  // repeated values
      float a1, a2, b1, b2, lo1, hi1, lo2, hi2;
      ref_.top2_abs(v.data(), n, &a1, &a2);
      fast_->top2_abs(v.data(), n, &b1, &b2);
      ASSERT_TRUE(SameBits(a1, b1) && SameBits(a2, b2)) << n << " " << seed;
      ref_.min_max(v.data(), n, &lo1, &hi1);
      fast_->min_max(v.data(), n, &lo2, &hi2);
      ASSERT_TRUE(SameBits(lo1, lo2) && SameBits(hi1, hi2));
    }
  }
}

TEST_F(KernelsVsScalar, Fwht) {
  for (int n : {8, 16, 32, 64, 128, 256}) {
    auto a = RandomFloats(n, n, 25.0f), b = a;
    ref_.fwht(a.data(), n);
    fast_->fwht(b.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_TRUE(SameBits(a[i], b[i])) << n << " " << i;
  }
}

TEST_F(KernelsVsScalar, QuantizeDequantize) {
  for (int n : {5, 8, 64, 67}) {
    auto v = RandomFloats(n, 3 * n);
    for (float maxq : {3.0f, 7.0f, 15.0f, 255.0f}) {
      std::vector<uint8_t> q1(n), q2(n);
      ref_.quantize(v.data(), n, -2.5f, maxq / 5.0f, maxq, q1.data());
      fast_->quantize(v.data(), n, -2.5f, maxq / 5.0f, maxq, q2.data());
      ASSERT_EQ(q1, q2);
      std::vector<float> o1(n), o2(n);
      ref_.dequantize(q1.data(), n, -2.5f, 5.0f / maxq, o1.data());
      fast_->dequantize(q1.data(), n, -2.5f, 5.0f / maxq, o2.data());
      for (int i = 0; i < n; ++i) ASSERT_TRUE(SameBits(o1[i], o2[i]));
    }
  }
}

TEST_F(KernelsVsScalar, PackUnpackEveryWidth) {
  std::mt19937 rng(9);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int n : {0, 1, 8, 13, 32, 64, 100, 2048, 2049}) {
      std::vector<uint8_t> q(n);
      for (auto& c : q) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      std::vector<uint8_t> p1(PackedBytes(n, bits) + 1, 0xAB), p2 = p1;
      ref_.pack(q.data(), n, bits, p1.data());
      fast_->pack(q.data(), n, bits, p2.data());
      ASSERT_EQ(p1, p2) << bits << " " << n;
      ASSERT_EQ(p1.back(), 0xAB) << "pack wrote past its output";
      std::vector<uint8_t> u1(n), u2(n);
      ref_.unpack(p1.data(), n, bits, u1.data());
      fast_->unpack(p1.data(), n, bits, u2.data());
      ASSERT_EQ(u1, q);
      ASSERT_EQ(u2, q);
    }
  }
}

TEST(ScalarKernels, FwhtIsTheOrthonormalSylvesterHadamard) {
  const int n = 16;
  auto v = RandomFloats(n, 77);
  auto w = v;
  ScalarKernels().fwht(w.data(), n);
  for (int i = 0; i < n; ++i) {
    double expect = 0;
    for (int j = 0; j < n; ++j) expect += ((__builtin_popcount(i & j) & 1) ? -1.0 : 1.0) * v[j];
    EXPECT_NEAR(w[i], expect / 4.0, 1e-5);
  }
  ScalarKernels().fwht(w.data(), n);  // H * H = I
  for (int i = 0; i < n; ++i) EXPECT_NEAR(w[i], v[i], 1e-5);
}

// The token sums against double-precision sums, and the entropy from them against its definition
// H = -sum p log2(p), p = |x| / |x|_1, for a spread token, a one-hot one and one of 5,000 elements.
TEST(ScalarKernels, TokenSumsAndEntropyMatchDefinition) {
  std::vector<std::vector<float>> cases = {RandomFloats(512, 4, 40.0f), std::vector<float>(300, 0.0f),
                                           RandomFloats(5000, 9)};
  cases[1][17] = -3.5f;
  for (const auto& v : cases) {
    TokenSums sums;
    ScalarKernels().token_sums(v.data(), v.size(), true, &sums);
    double s = 0, m = 0, alog = 0;
    for (float x : v) {
      const double a = std::fabs(x);
      s += a;
      m = std::max(m, a);
      if (a > 0) alog += a * std::log2(a);
    }
    EXPECT_NEAR(sums.sum, s, 1e-5 * s) << v.size();
    EXPECT_EQ(sums.max, m);
    EXPECT_NEAR(sums.alog, alog, kLog2ApproxTolerance * s + 1e-5 * std::fabs(alog)) << v.size();
    double h = 0;
    for (float x : v) {
      const double p = std::fabs(x) / s;
      if (p > 0) h -= p * std::log2(p);
    }
    EXPECT_NEAR(TokenEntropy(sums.sum, sums.alog), h, 2 * kLog2ApproxTolerance + 1e-4) << v.size();
  }
  EXPECT_TRUE(SameBits(TokenEntropy(0.0f, 0.0f), 0.0f));  // an all-zero token: +0
}

}  // namespace
}  // namespace longhaul::codec
