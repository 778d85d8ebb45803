// AVX2 kernels, bit-identical to kernels_scalar.cc (tests/codec/kernels_test.cc checks every entry
// on random inputs). This file is compiled with -mavx2 -mfma; it uses no templates shared with
// baseline code, and Avx2Kernels() returns nullptr unless the running CPU reports AVX2 and FMA.
#include <immintrin.h>

#include <cstring>

#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"

namespace longhaul::codec {
namespace {

inline __m256 Abs(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }

// Horizontal max/min, broadcast to every lane (max/min are exact: order does not matter).
inline __m256 HMaxV(__m256 v) {
  v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_max_ps(v, _mm256_permute_ps(v, 0x4E));
  return _mm256_max_ps(v, _mm256_permute_ps(v, 0xB1));
}
inline __m256 HMinV(__m256 v) {
  v = _mm256_min_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_min_ps(v, _mm256_permute_ps(v, 0x4E));
  return _mm256_min_ps(v, _mm256_permute_ps(v, 0xB1));
}
inline float HMax(__m256 v) { return _mm256_cvtss_f32(HMaxV(v)); }

// The 32 sum lanes are four vectors: acc[k] holds lanes 8k..8k+7.
inline void StoreLanes(const __m256* acc, float* lanes) {
  for (int k = 0; k < 4; ++k) _mm256_store_ps(lanes + 8 * k, acc[k]);
}

void AbsSumMax(const float* x, int64_t n, float* sum, float* max) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 mx = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int k = 0; k < 4; ++k) {
      const __m256 a = Abs(_mm256_loadu_ps(x + i + 8 * k));
      acc[k] = _mm256_add_ps(acc[k], a);
      mx = _mm256_max_ps(mx, a);
    }
  }
  alignas(32) float lanes[kSumLanes];
  StoreLanes(acc, lanes);
  float m = HMax(mx);
  for (; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    lanes[i % kSumLanes] += a;
    m = a > m ? a : m;
  }
  *sum = ReduceLanes32(lanes);
  *max = m;
}

inline __m256 FastLog2V(__m256 x) {  // x >= +0
  const __m256i bits = _mm256_castps_si256(x);
  const __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
  const __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)), _mm256_set1_epi32(0x3F800000)));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kLog2C4), m, _mm256_set1_ps(kLog2C3));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(kLog2C2));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(kLog2C1));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(kLog2C0));
  return _mm256_add_ps(e, p);
}

// The stride-doubling levels h = 1, 2, 4 of ReduceLanesAscending for eight runs of 8 lanes at once:
// lane k of the result is run k's ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m256 SumRunsOf8(const __m256* v) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// ReduceLanesAscending(l, n) with l zero from n up to p (a power of two >= n, at most kTokenLanes):
// the first three levels by SumRunsOf8, which leaves the runs' sums compacted in l[0, p / 8), where
// the next three levels are the same steps again.
float ReduceTokenLanes(float* l, int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  for (int64_t i = n; i < p; ++i) l[i] = 0.0f;
  for (; p >= 64; p /= 8) {
    for (int64_t b = 0; b < p; b += 64) {
      __m256 v[8];
      for (int k = 0; k < 8; ++k) v[k] = _mm256_load_ps(l + b + 8 * k);
      _mm256_store_ps(l + b / 8, SumRunsOf8(v));
    }
  }
  return ReduceLanesAscending(l, p);
}

// Rows of a multiple of 64 elements (every usual width; others take the scalar kernel): each run of
// 64 lanes summed in registers over its elements i, i + 2048, ... in order, then its first three
// levels by SumRunsOf8, so only the compacted sums go through memory.
template <bool kAlog>
void SumsOfTokenRuns(const float* x, int64_t n, TokenSums* out) {
  alignas(32) float sum[kTokenLanes / 8], alog[kTokenLanes / 8];
  const int64_t lanes = n < kTokenLanes ? n : kTokenLanes;
  __m256 mx = _mm256_setzero_ps();
  for (int64_t b = 0; b < lanes; b += 64) {
    __m256 s[8], a[8];
    for (int k = 0; k < 8; ++k) {
      s[k] = a[k] = _mm256_setzero_ps();
      for (int64_t i = b + 8 * k; i < n; i += kTokenLanes) {
        const __m256 v = Abs(_mm256_loadu_ps(x + i));
        s[k] = _mm256_add_ps(s[k], v);
        if constexpr (kAlog) a[k] = _mm256_fmadd_ps(v, FastLog2V(v), a[k]);
        mx = _mm256_max_ps(mx, v);
      }
    }
    _mm256_store_ps(sum + b / 8, SumRunsOf8(s));
    if constexpr (kAlog) _mm256_store_ps(alog + b / 8, SumRunsOf8(a));
  }
  out->sum = ReduceTokenLanes(sum, lanes / 8);
  out->alog = kAlog ? ReduceTokenLanes(alog, lanes / 8) : 0.0f;
  out->max = HMax(mx);
}

void SumsOfToken(const float* x, int64_t n, bool with_alog, TokenSums* out) {
  if (n % 64 != 0) return ScalarKernels().token_sums(x, n, with_alog, out);
  with_alog ? SumsOfTokenRuns<true>(x, n, out) : SumsOfTokenRuns<false>(x, n, out);
}

void Top2Abs(const float* g, int n, float* a1, float* a2) {
  if (n % 8 != 0) return ScalarKernels().top2_abs(g, n, a1, a2);
  __m256 m1 = _mm256_setzero_ps(), m2 = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    const __m256 a = Abs(_mm256_loadu_ps(g + i));
    m2 = _mm256_max_ps(m2, _mm256_min_ps(m1, a));
    m1 = _mm256_max_ps(m1, a);
  }
  // Global top-2 of the per-lane top-2s: a1 is the largest m1; a2 is a1 again when a1 heads two
  // lanes, else the largest of all m2 and of the other lanes' m1 (values are >= 0, so zeroing the
  // winning lane removes it).
  const __m256 a1v = HMaxV(m1);
  const __m256 is_a1 = _mm256_cmp_ps(m1, a1v, _CMP_EQ_OQ);
  *a1 = _mm256_cvtss_f32(a1v);
  if (__builtin_popcount(_mm256_movemask_ps(is_a1)) >= 2) {
    *a2 = *a1;
  } else {
    *a2 = HMax(_mm256_max_ps(m2, _mm256_andnot_ps(is_a1, m1)));
  }
}

void MinMax(const float* v, int n, float* lo, float* hi) {
  if (n % 8 != 0) return ScalarKernels().min_max(v, n, lo, hi);
  __m256 l = _mm256_loadu_ps(v), h = l;
  for (int i = 8; i < n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    l = _mm256_min_ps(l, x);
    h = _mm256_max_ps(h, x);
  }
  *lo = _mm256_cvtss_f32(HMinV(l));
  *hi = _mm256_cvtss_f32(HMaxV(h));
}

// The transform's first three levels (h = 1, 2, 4) inside one vector of 8.
inline __m256 FwhtOctet(__m256 x) {
  __m256 s = _mm256_permute_ps(x, 0xB1);  // h = 1: swap neighbours
  x = _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xAA);
  s = _mm256_permute_ps(x, 0x4E);  // h = 2: swap pairs
  x = _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xCC);
  s = _mm256_permute2f128_ps(x, x, 0x01);  // h = 4: swap halves
  return _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xF0);
}

// A Hadamard block of 32 (kHadamardBlock, every call of the symmetric codec) in four registers:
// the same operations in the same order as the loops below, so the same bits.
void Fwht32(float* v) {
  __m256 x0 = FwhtOctet(_mm256_loadu_ps(v)), x1 = FwhtOctet(_mm256_loadu_ps(v + 8));
  __m256 x2 = FwhtOctet(_mm256_loadu_ps(v + 16)), x3 = FwhtOctet(_mm256_loadu_ps(v + 24));
  __m256 a = _mm256_add_ps(x0, x1), b = _mm256_sub_ps(x0, x1);  // h = 8
  __m256 c = _mm256_add_ps(x2, x3), d = _mm256_sub_ps(x2, x3);
  const __m256 norm = _mm256_set1_ps(HadamardNorm(32));
  _mm256_storeu_ps(v, _mm256_mul_ps(_mm256_add_ps(a, c), norm));  // h = 16
  _mm256_storeu_ps(v + 8, _mm256_mul_ps(_mm256_add_ps(b, d), norm));
  _mm256_storeu_ps(v + 16, _mm256_mul_ps(_mm256_sub_ps(a, c), norm));
  _mm256_storeu_ps(v + 24, _mm256_mul_ps(_mm256_sub_ps(b, d), norm));
}

void Fwht(float* v, int n) {
  if (n == 32) return Fwht32(v);
  if (n % 8 != 0) return ScalarKernels().fwht(v, n);
  const int nv = n / 8;
  for (int k = 0; k < nv; ++k) _mm256_storeu_ps(v + 8 * k, FwhtOctet(_mm256_loadu_ps(v + 8 * k)));
  for (int h = 1; h < nv; h *= 2) {
    for (int i = 0; i < nv; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const __m256 a = _mm256_loadu_ps(v + 8 * j), b = _mm256_loadu_ps(v + 8 * (j + h));
        _mm256_storeu_ps(v + 8 * j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(v + 8 * (j + h), _mm256_sub_ps(a, b));
      }
    }
  }
  const __m256 norm = _mm256_set1_ps(HadamardNorm(n));
  for (int k = 0; k < nv; ++k) _mm256_storeu_ps(v + 8 * k, _mm256_mul_ps(_mm256_loadu_ps(v + 8 * k), norm));
}

inline __m128i Pack8xI32ToU8(__m256i i) {
  const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  return _mm_packus_epi16(p16, p16);
}

void Quantize(const float* v, int n, float lo, float inv_scale, float maxq, uint8_t* q) {
  const __m256 vlo = _mm256_set1_ps(lo), vinv = _mm256_set1_ps(inv_scale);
  const __m256 vmax = _mm256_set1_ps(maxq), zero = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), vlo), vinv);
    r = _mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, zero), vmax);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), Pack8xI32ToU8(_mm256_cvtps_epi32(r)));
  }
  if (i < n) ScalarKernels().quantize(v + i, n - i, lo, inv_scale, maxq, q + i);
}

void Dequantize(const uint8_t* q, int n, float lo, float scale, float* out) {
  const __m256 vlo = _mm256_set1_ps(lo), vs = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), vs), vlo));
  }
  if (i < n) ScalarKernels().dequantize(q + i, n - i, lo, scale, out + i);
}

void Pack(const uint8_t* q, int64_t n, int bits, uint8_t* out) {
  int64_t i = 0;
  if (bits == 4) {
    const __m256i mul = _mm256_set1_epi16(0x1001);  // bytes {1, 16}
    for (; i + 64 <= n; i += 64, out += 32) {
      const __m256i a = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), mul);
      const __m256i b = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i + 32)), mul);
      const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), p);
    }
  } else if (bits == 3) {
    const __m256i mul8 = _mm256_set1_epi16(0x0801);   // bytes {1, 8}
    const __m256i mul64 = _mm256_set1_epi32(0x00400001);  // words {1, 64}
    const __m256i gather = _mm256_setr_epi8(0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    alignas(32) uint8_t tmp[32];
    for (; i + 32 <= n; i += 32, out += 12) {
      __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
      x = _mm256_madd_epi16(_mm256_maddubs_epi16(x, mul8), mul64);  // 4 codes per u32 (12 bits)
      x = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi64x(0xFFFFFFFF)),
                          _mm256_slli_epi64(_mm256_srli_epi64(x, 32), 12));  // 8 codes per u64
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm256_shuffle_epi8(x, gather));
      std::memcpy(out, tmp, 6);
      std::memcpy(out + 6, tmp + 16, 6);
    }
  } else if (bits == 8) {
    std::memcpy(out, q, n);
    return;
  }
  if (i < n) ScalarKernels().pack(q + i, n - i, bits, out);
}

void Unpack(const uint8_t* in, int64_t n, int bits, uint8_t* q) {
  int64_t i = 0;
  if (bits == 4) {
    const __m128i low = _mm_set1_epi8(0x0F);
    for (; i + 32 <= n; i += 32, in += 16) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
      const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm_unpacklo_epi8(lo, hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i + 16), _mm_unpackhi_epi8(lo, hi));
    }
  } else if (bits == 3) {
    const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    const __m256i seven = _mm256_set1_epi32(7);
    for (; i + 8 <= n; i += 8, in += 3) {
      const uint32_t w = static_cast<uint32_t>(in[0]) | (static_cast<uint32_t>(in[1]) << 8) |
                         (static_cast<uint32_t>(in[2]) << 16);
      const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts), seven);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), Pack8xI32ToU8(c));
    }
  } else if (bits == 8) {
    std::memcpy(q, in, n);
    return;
  }
  if (i < n) ScalarKernels().unpack(in, n - i, bits, q + i);
}

const Kernels kAvx2 = {"avx2", AbsSumMax, SumsOfToken, Top2Abs, MinMax, Fwht,
                       Quantize, Dequantize, Pack, Unpack};

}  // namespace

const Kernels* Avx2Kernels() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have ? &kAvx2 : nullptr;
}

}  // namespace longhaul::codec
