// mf12: the 12-bit float that carries per-group quantisation parameters (lo and scale) in the
// grouped-quantisation payload. 1 sign bit, 5 exponent bits, 6 mantissa bits, no subnormals:
//   code = s<<11 | e<<6 | m;  e == 0 -> 0;  else value = (-1)^s * (1 + m/64) * 2^(e - 31).
// Values are stored relative to a per-token power of two (see group_quant.h), so the range
// [2^-30, 2) covers a token's dynamic range. Encoding rounds in a caller-chosen direction: the
// encoder rounds lo down and the scale up, then quantises against the decoded values, so the
// stored grid always covers the group.
#ifndef LONGHAUL_CODEC_MINIFLOAT_H_
#define LONGHAUL_CODEC_MINIFLOAT_H_

#include <cmath>
#include <cstdint>

namespace longhaul::codec {

enum class RoundDir { kDown, kUp };  // toward -infinity, toward +infinity

inline constexpr uint16_t kMf12Max = (31u << 6) | 63u;  // magnitude bits of the largest value

inline uint16_t Mf12Encode(float v, RoundDir dir) {
  const bool neg = std::signbit(v);
  const float a = std::fabs(v);
  if (a == 0.0f) return 0;
  const bool away = (dir == RoundDir::kUp) != neg;  // rounding away from zero?
  int e2;
  const float f = std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
  int e = e2 - 1 + 31;                  // a = (2f) * 2^(e2-1)
  const float mreal = (2.0f * f - 1.0f) * 64.0f;  // exact
  int m = static_cast<int>(away ? std::ceil(mreal) : std::floor(mreal));
  if (m == 64) {
    m = 0;
    ++e;
  }
  const uint16_t sign = neg ? (1u << 11) : 0u;
  if (e < 1) return away ? static_cast<uint16_t>(sign | (1u << 6)) : 0;
  if (e > 31) return static_cast<uint16_t>(sign | kMf12Max);  // callers keep values below 2
  return static_cast<uint16_t>(sign | (e << 6) | m);
}

inline float Mf12Decode(uint16_t code) {
  const int e = (code >> 6) & 31;
  if (e == 0) return 0.0f;
  const float v = std::ldexp(1.0f + static_cast<float>(code & 63) / 64.0f, e - 31);
  return (code & (1u << 11)) ? -v : v;
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_MINIFLOAT_H_
