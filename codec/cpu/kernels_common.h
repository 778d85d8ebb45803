// Arithmetic shared by the scalar and SIMD kernels, so both compute the same bits.
// Internal to codec/cpu. Everything here is static inline on purpose: the AVX2 translation unit
// must not share out-of-line template instances with baseline-ISA code.
#ifndef LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_
#define LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace longhaul::codec {

// Fixed reduction order of 8 lane accumulators.
static inline float ReduceLanes8(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// log2(x) for normal x > 0: exponent + degree-4 polynomial in the mantissa m in [1, 2)
// (max abs error about 1.2e-4). Only multiplies and adds, in this order, so SIMD can match it.
inline constexpr float kLog2C0 = -2.4983531f;  // Chebyshev-node fit, Horner order c4..c0
inline constexpr float kLog2C1 = 4.0292114f;
inline constexpr float kLog2C2 = -2.0783352f;
inline constexpr float kLog2C3 = 0.62603218f;
inline constexpr float kLog2C4 = -0.078440676f;

static inline float FastLog2(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
  const uint32_t mbits = (bits & 0x007FFFFFu) | 0x3F800000u;
  float m;
  std::memcpy(&m, &mbits, 4);
  float p = kLog2C4 * m + kLog2C3;
  p = p * m + kLog2C2;
  p = p * m + kLog2C1;
  p = p * m + kLog2C0;
  return e + p;
}

static inline float HadamardNorm(int n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_
