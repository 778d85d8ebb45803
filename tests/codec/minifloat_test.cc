#include "codec/minifloat.h"

#include <gtest/gtest.h>

#include <random>

namespace longhaul::codec {
namespace {

TEST(Mf12, DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> mant(1.0f, 1.99f);
  std::uniform_int_distribution<int> ex(-29, 0);
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
