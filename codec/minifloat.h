// mf12: the 12-bit float that carries per-group quantisation parameters (lo and scale) in the
// grouped-quantisation payload. 1 sign bit, 5 exponent bits, 6 mantissa bits, no subnormals:
//   code = s<<11 | e<<6 | m;  e == 0 -> 0;  else value = (-1)^s * (1 + m/64) * 2^(e - 31).
// Values are stored relative to a per-token power of two (see group_quant.h), so the range
// [2^-30, 2) covers a token's dynamic range. Encoding rounds in a caller-chosen direction: the
// encoder rounds lo down and the scale up, then quantises against the decoded values, so the
// stored grid always covers the group.
#ifndef LONGHAUL_CODEC_MINIFLOAT_H_
#define LONGHAUL_CODEC_MINIFLOAT_H_

#include <cstdint>
#include <cstring>

#include "codec/hd.h"

namespace longhaul::codec {

enum class RoundDir { kDown, kUp };  // toward -infinity, toward +infinity

inline constexpr uint16_t kMf12Max = (31u << 6) | 63u;  // magnitude bits of the largest value

// Works on the float's bits: exact, and an order of magnitude faster than frexp/ldexp (it runs
// twice per group of 64 elements on the encode path).
LONGHAUL_HD inline uint16_t Mf12Encode(float v, RoundDir dir) {
  const uint32_t b = FloatBits(v);
  const bool neg = b >> 31;
  const uint32_t mag = b & 0x7FFFFFFFu;
  if (mag == 0) return 0;
  const bool away = (dir == RoundDir::kUp) != neg;  // rounding away from zero?
  const uint16_t sign = neg ? (1u << 11) : 0u;
  int e = static_cast<int>(mag >> 23) - 127 + 31;  // float subnormals land far below 1
  uint32_t m = (mag >> 17) & 63u;
  if (away && (mag & 0x1FFFFu) != 0 && ++m == 64) {
    m = 0;
    ++e;
  }
  if (e < 1) return away ? static_cast<uint16_t>(sign | (1u << 6)) : 0;
  if (e > 31) return static_cast<uint16_t>(sign | kMf12Max);  // callers keep values below 2
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e) << 6) | m);
}

LONGHAUL_HD inline float Mf12Decode(uint16_t code) {
  const uint32_t e = (code >> 6) & 31u;
  if (e == 0) return 0.0f;
  const uint32_t b = (static_cast<uint32_t>(code & 0x800u) << 20) | ((e - 31 + 127) << 23) |
                     (static_cast<uint32_t>(code & 63u) << 17);
  return BitsFloat(b);
}

// 2^e as a float, for e in [-126, 127] (exact; multiplying by it equals ldexp).
LONGHAUL_HD inline float Pow2(int e) {
  return BitsFloat(static_cast<uint32_t>(e + 127) << 23);
}

// The parameters of one group of the grouped quantiser (group_quant.h) from its range [lo, hi] and
// the token's exponent: lo rounded down and the scale up to mf12, so the stored grid always covers
// the group, and the codes are computed against the decoded values. One definition for the CPU
// reference and the CUDA kernels.
struct GroupParams {
  float lo_q = 0;       // decoded lo
  float inv_scale = 0;  // 1 / decoded scale, 0 when the scale is 0
  uint32_t word = 0;    // the 24-bit parameter word: lo (mf12), scale magnitude, transformed flag
};

LONGHAUL_HD inline GroupParams MakeGroupParams(float lo, float hi, int exp, int maxq, bool flagged) {
  const float to_rel = Pow2(-exp), from_rel = Pow2(exp);
  const uint16_t lo_code = Mf12Encode(lo * to_rel, RoundDir::kDown);
  GroupParams g;
  g.lo_q = Mf12Decode(lo_code) * from_rel;
  const float scale = (hi - g.lo_q) / static_cast<float>(maxq);
  const uint16_t s_code = Mf12Encode(scale * to_rel, RoundDir::kUp);
  const float s_q = Mf12Decode(s_code) * from_rel;
  g.inv_scale = s_q > 0.0f ? 1.0f / s_q : 0.0f;
  g.word = static_cast<uint32_t>(lo_code) | (static_cast<uint32_t>(s_code & 0x7FF) << 12) | (flagged ? (1u << 23) : 0u);
  return g;
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_MINIFLOAT_H_
