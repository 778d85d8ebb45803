#include "codec/minifloat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace longhaul::codec {
namespace {

// Straightforward frexp-based definition of mf12, the reference for the bit-twiddling encoder.
uint16_t Mf12EncodeReference(float v, RoundDir dir) {
  const bool neg = std::signbit(v);
  const float a = std::fabs(v);
  if (a == 0.0f) return 0;
  const bool away = (dir == RoundDir::kUp) != neg;
  int e2;
  const float f = std::frexp(a, &e2);
  int e = e2 - 1 + 31;
  const float mreal = (2.0f * f - 1.0f) * 64.0f;
  int m = static_cast<int>(away ? std::ceil(mreal) : std::floor(mreal));
  if (m == 64) m = 0, ++e;
  const uint16_t sign = neg ? (1u << 11) : 0u;
  if (e < 1) return away ? static_cast<uint16_t>(sign | (1u << 6)) : 0;
  if (e > 31) return static_cast<uint16_t>(sign | kMf12Max);
  return static_cast<uint16_t>(sign | (e << 6) | m);
}

TEST(Mf12, FastEncoderMatchesReference) {
  std::mt19937 rng(3);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t b = rng();
    float v;
    std::memcpy(&v, &b, 4);
    if (!std::isfinite(v)) continue;
    if (i % 2) v = std::ldexp(v, -std::ilogb(v) + static_cast<int>(rng() % 40) - 34);  // near range
    for (RoundDir d : {RoundDir::kDown, RoundDir::kUp}) {
      ASSERT_EQ(Mf12Encode(v, d), Mf12EncodeReference(v, d)) << v;
    }
  }
}

TEST(Mf12, DecodeAndPow2MatchLdexp) {
  for (uint16_t c = 0; c < 4096; ++c) {
    const int e = (c >> 6) & 31;
    const float ref = e == 0 ? 0.0f : ((c & 0x800) ? -1.f : 1.f) * std::ldexp(1.0f + (c & 63) / 64.0f, e - 31);
    ASSERT_EQ(Mf12Decode(c), ref) << c;
  }
  for (int e = -126; e <= 127; ++e) ASSERT_EQ(Pow2(e), std::ldexp(1.0f, e));
}

TEST(Mf12, DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> mant(1.0f, 1.99f);
  std::uniform_int_distribution<int> ex(-29, -1);  // callers keep |v| < 1
  for (int i = 0; i < 100000; ++i) {
    const float v = std::ldexp(mant(rng), ex(rng)) * ((i & 1) ? -1.0f : 1.0f);
    const float down = Mf12Decode(Mf12Encode(v, RoundDir::kDown));
    const float up = Mf12Decode(Mf12Encode(v, RoundDir::kUp));
    ASSERT_LE(down, v) << v;
    ASSERT_GE(up, v) << v;
    // 6 mantissa bits: the bracket is at most one step, 2^-6 relative.
    ASSERT_LE(up - down, std::fabs(v) * (1.0f / 64.0f) * 1.0001f) << v;
  }
}

TEST(Mf12, ExactValuesRoundTrip) {
  for (uint16_t c = 0; c < 4096; ++c) {
    if (((c >> 6) & 31) == 0) continue;  // zero codes
    const float v = Mf12Decode(c);
    EXPECT_EQ(Mf12Encode(v, RoundDir::kDown), c);
    EXPECT_EQ(Mf12Encode(v, RoundDir::kUp), c);
  }
}

TEST(Mf12, TinyValuesRoundTowardTheRequestedSide) {
  const float tiny = 1e-12f;  // below 2^-30
  EXPECT_EQ(Mf12Decode(Mf12Encode(tiny, RoundDir::kDown)), 0.0f);
  EXPECT_GT(Mf12Decode(Mf12Encode(tiny, RoundDir::kUp)), tiny);
  EXPECT_LT(Mf12Decode(Mf12Encode(-tiny, RoundDir::kDown)), -tiny);
  EXPECT_EQ(Mf12Decode(Mf12Encode(0.0f, RoundDir::kUp)), 0.0f);
}

}  // namespace
}  // namespace longhaul::codec
