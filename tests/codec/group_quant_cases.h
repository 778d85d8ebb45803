// Inputs and parameter cases shared by the grouped-quantisation tests that compare other
// implementations with the CPU reference (the GPU kernels, and their per-group steps run on the
// host): LLM-like activations with special rows, bf16 rounding, every group size and allocation.
#ifndef LONGHAUL_TESTS_CODEC_GROUP_QUANT_CASES_H_
#define LONGHAUL_TESTS_CODEC_GROUP_QUANT_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/group_quant.h"

namespace longhaul::codec::gq_testing {

inline uint16_t ToBf16(float f) {  // round to nearest even, as LibTorch converts
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

inline float FromBf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Per-token scale, a few outlier channels, and rows that are all zero, negative zeros, constant,
// one-hot and subnormal.
inline std::vector<float> Activations(int64_t tokens, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> x(tokens * dim);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = x.data() + t * dim;
    const float scale = std::exp(3.0f * (uni(rng) - 0.5f));
    for (int64_t i = 0; i < dim; ++i) {
      row[i] = normal(rng) * scale;
      if (uni(rng) < 0.01f) row[i] *= 40.0f;
    }
    switch (t % 11) {
      case 3: std::fill(row, row + dim, 0.0f); break;
      case 5: std::fill(row, row + dim, -0.0f); break;
      case 7: std::fill(row, row + dim, 1.5f); break;
      case 9: std::fill(row, row + dim, 0.0f); row[dim / 2] = -3.0f; break;
      case 10: for (int64_t i = 0; i < dim; ++i) row[i] *= 1e-41f; break;
      default: break;
    }
  }
  return x;
}

struct Case {
  const char* name;
  GroupQuantParams p;
};

// tahquant (default tau, tau 1.05 flagging most full groups, and `extra_tau` when > 0), tahquant
// with the hash allocation and int8, for every group size; int2/3/5/7; three bit ratios.
inline std::vector<Case> Cases(float extra_tau = 0.0f) {
  std::vector<Case> c;
  for (int g : {8, 16, 32, 64, 128, 256}) {
    GroupQuantParams tah;
    tah.group_size = g;
    c.push_back({"tahquant", tah});
    GroupQuantParams tight = tah;
    tight.tau = 1.05f;
    c.push_back({"tahquant-tau1.05", tight});
    if (extra_tau > 0) {
      GroupQuantParams extra = tah;
      extra.tau = extra_tau;
      c.push_back({"tahquant-extra-tau", extra});
    }
    GroupQuantParams fixed = tah;
    fixed.adaptive = false;
    c.push_back({"tahquant-hash", fixed});
    GroupQuantParams k8;
    k8.group_size = g;
    k8.bits_hi = k8.bits_lo = 8;
    k8.adaptive = false;
    k8.hadamard = false;
    k8.ratio = 1.0f;
    c.push_back({"int8", k8});
  }
  for (int bits : {2, 3, 5, 7}) {
    GroupQuantParams k;
    k.bits_hi = k.bits_lo = bits;
    k.adaptive = false;
    k.hadamard = false;
    c.push_back({"int<k>", k});
  }
  for (float ratio : {0.0f, 0.5f, 1.0f}) {
    GroupQuantParams r;
    r.ratio = ratio;
    r.bits_hi = 6;
    r.bits_lo = 2;
    c.push_back({"ratio", r});
  }
  return c;
}

struct Shape {
  int64_t tokens, dim;
};

inline constexpr Shape kShapes[] = {{1, 1},   {3, 7},     {5, 64},   {17, 100}, {33, 257},
                                    {11, 1000}, {64, 4096}, {300, 96}, {2, 8200}};

}  // namespace longhaul::codec::gq_testing

#endif  // LONGHAUL_TESTS_CODEC_GROUP_QUANT_CASES_H_
