// Arithmetic shared by the scalar and SIMD kernels, so both compute the same bits.
// Internal to codec/cpu. Everything here is static inline on purpose: the AVX2 translation unit
// must not share out-of-line template instances with baseline-ISA code.
#ifndef LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_
#define LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "codec/hd.h"

namespace longhaul::codec {

// The fixed reduction order of sums (kernels.h): 32 lane accumulators, lane j taking the elements
// i = j mod 32 in order, combined pairwise in place, l[i] += l[i + h] for h = 16, 8, 4, 2, 1, the
// result in l[0]. A CUDA warp computes the same with v += shfl_xor(v, h) (codec/cuda/).
inline constexpr int kSumLanes = 32;
template <typename T>
LONGHAUL_HD static inline T ReduceLanes32(T* l) {
  for (int h = kSumLanes / 2; h >= 1; h /= 2) {
    for (int i = 0; i < h; ++i) l[i] = l[i] + l[i + h];
  }
  return l[0];
}

// log2(x) for normal x > 0: exponent + degree-4 polynomial in the mantissa m in [1, 2)
// (max abs error about 1.2e-4). Only multiplies and adds, in this order, so SIMD can match it.
inline constexpr float kLog2C0 = -2.4983531f;  // Chebyshev-node fit, Horner order c4..c0
inline constexpr float kLog2C1 = 4.0292114f;
inline constexpr float kLog2C2 = -2.0783352f;
inline constexpr float kLog2C3 = 0.62603218f;
inline constexpr float kLog2C4 = -0.078440676f;

LONGHAUL_HD static inline float FastLog2(float x) {
  const uint32_t bits = FloatBits(x);
#ifdef __CUDA_ARCH__
  // The same value without a conversion instruction (a quarter-rate unit on the GPU): 2^23 + k
  // exactly, minus 2^23 + 127, exact.
  const float e = __fsub_rn(__uint_as_float(0x4B000000u | (bits >> 23)), 8388735.0f);
#else
  const float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
#endif
  const float m = BitsFloat((bits & 0x007FFFFFu) | 0x3F800000u);
  float p = kLog2C4 * m + kLog2C3;
  p = p * m + kLog2C2;
  p = p * m + kLog2C1;
  p = p * m + kLog2C0;
  return e + p;
}

static inline float HadamardNorm(int n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_
