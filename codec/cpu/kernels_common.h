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

// A fused multiply-add, a * b + c rounded once: fmaf on the host, the same instruction on the GPU
// (and _mm256_fmadd_ps in the AVX2 kernels): the one operation here that is fused.
LONGHAUL_HD static inline float Fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);  // not std::fma: no inline function shared with the AVX2 unit
#endif
}

// log2(x) for x >= +0: exponent + degree-4 polynomial in the mantissa m in [1, 2) by fused
// multiply-adds in Horner order (max abs error about 1.2e-4 for normal x; finite for 0 and
// subnormals, whose terms x * log2(x) then round to about 0).
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
  float p = Fma(kLog2C4, m, kLog2C3);
  p = Fma(p, m, kLog2C2);
  p = Fma(p, m, kLog2C1);
  p = Fma(p, m, kLog2C0);
  return e + p;
}

// The grouped encoder's token sums (kernels.h token_sums) run in 2048 lanes, lane j taking the
// elements i = j mod 2048 in order: a GPU block of 256 threads holds them as 8 consecutive elements
// a thread. The lanes are then combined pairwise with the stride doubling, l[i] = l[i] + l[i + h]
// for i a multiple of 2h, h = 1, 2, 4, ..., the result in l[0] (within a thread's 8 first, then
// across threads): ReduceLanesAscending over the first n lanes (lanes past n would add +0, which
// changes no partial sum here: none is -0).
inline constexpr int kTokenLanes = 2048;
template <typename T>
static inline T ReduceLanesAscending(T* l, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i + h < n; i += 2 * h) l[i] = l[i] + l[i + h];
  }
  return n > 0 ? l[0] : T(0);
}

// eps of the paper's p_i = |x_i| / (|x|_1 + eps).
inline constexpr float kEntropyL1Eps = 1e-12f;

// A token's entropy in bits, H = -sum p_i log2 p_i with p_i = |x_i| / d, d = S + eps, from its sums
// S = sum |x_i| and A = sum |x_i| log2 |x_i| (token_sums): H = (log2(d) S - A) / d, log2 by
// FastLog2; +0 for -0, so that equal entropies have equal bits.
LONGHAUL_HD static inline float TokenEntropy(float sum, float alog) {
  const float d = sum + kEntropyL1Eps;
  return (FastLog2(d) * sum - alog) / d + 0.0f;
}

// TAH-Quant's outlier test of a group whose two largest |g_i| are a1 >= a2: rho = a1 / (a2 + eps)
// above tau, computed as a1 > tau (a2 + eps) (a multiply, not a division: the same test up to
// rounding, and one definition for the CPU and the GPU).
inline constexpr float kRhoEps = 1e-12f;
LONGHAUL_HD static inline bool IsOutlierGroup(float a1, float a2, float tau) { return a1 > tau * (a2 + kRhoEps); }

static inline float HadamardNorm(int n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CPU_KERNELS_COMMON_H_
