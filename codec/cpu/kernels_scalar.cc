// Scalar reference kernels. Written for clarity and for bit-exact agreement with the SIMD
// versions: see the accumulation-order contract in kernels.h.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"

namespace longhaul::codec {
namespace {

void AbsSumMax(const float* x, int64_t n, float* sum, float* max) {
  float acc[kSumLanes] = {};
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    acc[i % kSumLanes] += a;
    m = a > m ? a : m;
  }
  *sum = ReduceLanes32(acc);
  *max = m;
}

void SumsOfToken(const float* x, int64_t n, bool with_alog, TokenSums* out) {
  float sum[kTokenLanes], alog[kTokenLanes];
  const int64_t lanes = n < kTokenLanes ? n : kTokenLanes;
  for (int64_t j = 0; j < lanes; ++j) sum[j] = alog[j] = 0.0f;
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    const int64_t j = i % kTokenLanes;
    sum[j] += a;
    if (with_alog) alog[j] = Fma(a, FastLog2(a), alog[j]);
    m = a > m ? a : m;
  }
  out->sum = ReduceLanesAscending(sum, lanes);
  out->alog = with_alog ? ReduceLanesAscending(alog, lanes) : 0.0f;
  out->max = m;
}

void Top2Abs(const float* g, int n, float* a1, float* a2) {
  float m1 = 0.0f, m2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(g[i]);
    if (a > m1) {
      m2 = m1;
      m1 = a;
    } else if (a > m2) {
      m2 = a;
    }
  }
  *a1 = m1;
  *a2 = m2;
}

void MinMax(const float* v, int n, float* lo, float* hi) {
  float l = v[0], h = v[0];
  for (int i = 1; i < n; ++i) {
    l = v[i] < l ? v[i] : l;
    h = v[i] > h ? v[i] : h;
  }
  *lo = l;
  *hi = h;
}

void Fwht(float* v, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const float norm = HadamardNorm(n);
  for (int i = 0; i < n; ++i) v[i] *= norm;
}

void Quantize(const float* v, int n, float lo, float inv_scale, float maxq, uint8_t* q) {
  for (int i = 0; i < n; ++i) {
    float r = std::nearbyint((v[i] - lo) * inv_scale);
    r = r >= 0.0f ? r : 0.0f;  // also NaN (0 * inf when a scale underflows) -> 0, as max_ps does in AVX2
    r = r > maxq ? maxq : r;
    q[i] = static_cast<uint8_t>(static_cast<int>(r));
  }
}

void Dequantize(const uint8_t* q, int n, float lo, float scale, float* out) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale + lo;
}

void Pack(const uint8_t* q, int64_t n, int bits, uint8_t* out) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= (q[i + j] & mask) << (j * bits);
    std::memcpy(out, &w, bits);
    out += bits;
  }
  if (i < n) {
    uint64_t w = 0;
    for (int j = 0; i + j < n; ++j) w |= (q[i + j] & mask) << (j * bits);
    std::memcpy(out, &w, PackedBytes(n - i, bits));
  }
}

void Unpack(const uint8_t* in, int64_t n, int bits, uint8_t* q) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, in, bits);
    in += bits;
    for (int j = 0; j < 8; ++j) q[i + j] = static_cast<uint8_t>((w >> (j * bits)) & mask);
  }
  if (i < n) {
    uint64_t w = 0;
    std::memcpy(&w, in, PackedBytes(n - i, bits));
    for (int j = 0; i + j < n; ++j) q[i + j] = static_cast<uint8_t>((w >> (j * bits)) & mask);
  }
}

const Kernels kScalar = {"scalar", AbsSumMax, SumsOfToken, Top2Abs, MinMax, Fwht,
                         Quantize, Dequantize, Pack, Unpack};

}  // namespace

const Kernels& ScalarKernels() { return kScalar; }

const Kernels& BestKernels() {
  static const Kernels* best = [] {
    const char* force = std::getenv("LONGHAUL_KERNELS");
    if (force != nullptr && std::string(force) == "scalar") return &kScalar;
    const Kernels* avx2 = Avx2Kernels();
    return avx2 != nullptr ? avx2 : &kScalar;
  }();
  return *best;
}

}  // namespace longhaul::codec
