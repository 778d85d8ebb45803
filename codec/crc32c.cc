#include "codec/crc32c.h"

#include <algorithm>
#include <array>
#include <utility>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace longhaul::codec {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

#if defined(__x86_64__)
// One stream: crc32 has a 3-cycle latency and 1-cycle throughput, so a single dependency chain
// runs at a third of the instruction's speed. Raw register state in and out (no inversion).
__attribute__((target("sse4.2"))) uint64_t RawSse42(uint64_t c, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// "Append `len` zero bytes" as a linear map of the raw CRC register, tabulated per input byte:
// Shift(c) = t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24].
// Because the raw register is linear in its start value, crc(s, A || B) = Shift_|B|(crc(s, A)) ^
// crc(0, B), which lets three independent streams be computed at once and joined.
struct ZerosOperator {
  uint32_t t[4][256];
  __attribute__((target("sse4.2"))) explicit ZerosOperator(size_t len) {
    static const uint8_t kZeros[4096] = {};
    uint32_t column[32];  // the image of each basis vector
    for (int b = 0; b < 32; ++b) {
      uint64_t c = uint32_t{1} << b;
      for (size_t left = len; left > 0;) {
        const size_t n = std::min(left, sizeof(kZeros));
        c = RawSse42(c, kZeros, n);
        left -= n;
      }
      column[b] = static_cast<uint32_t>(c);
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b) {
          if (v >> b & 1) r ^= column[8 * k + b];
        }
        t[k][v] = r;
      }
    }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24];
  }
};

constexpr size_t kLongStream = 8192, kShortStream = 256;

// Three interleaved streams over blocks of 3 x kLongStream, then 3 x kShortStream, then one
// stream for the tail: about 3x the single-stream speed on large buffers.
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ZerosOperator* const long_shift = new ZerosOperator(kLongStream);
  static const ZerosOperator* const short_shift = new ZerosOperator(kShortStream);
  uint64_t c0 = static_cast<uint32_t>(~crc);
  for (const auto& [stream, shift] : {std::pair{kLongStream, long_shift}, std::pair{kShortStream, short_shift}}) {
    while (n >= 3 * stream) {
      uint64_t c1 = 0, c2 = 0;
      const uint8_t* q = p;
      for (const uint8_t* end = p + stream; q < end; q += 8) {
        uint64_t a, b, d;
        std::memcpy(&a, q, 8);
        std::memcpy(&b, q + stream, 8);
        std::memcpy(&d, q + 2 * stream, 8);
        c0 = _mm_crc32_u64(c0, a);
        c1 = _mm_crc32_u64(c1, b);
        c2 = _mm_crc32_u64(c2, d);
      }
      c0 = shift->Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
      c0 = shift->Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
      p += 3 * stream;
      n -= 3 * stream;
    }
  }
  return ~static_cast<uint32_t>(RawSse42(c0, p, n));
}

// Carry-less-multiply folding (VPCLMULQDQ on 512-bit registers, 256 bytes per iteration).
//
// A 16-byte lane loaded little-endian holds message bits with integer bit j <-> polynomial degree
// 127 - j (reflected CRC: the first bit is the highest power). Moving a lane A = A1 x^64 + A0 (A1:
// its low qword, the earlier bytes) D bits further down the message multiplies it by x^D, and
// modulo P that is A1 (x^(63+D) mod P) x + A0 (x^(D-1) mod P) x: two 64 x 32-bit carry-less
// products whose results land, bit for bit, in the same 128-bit lane convention when the 32-bit
// constants sit in bits 32..63 (the extra factor x is the one-bit offset of the product). The
// folded lane is XORed into the lane D bits later. What is left at the end is one lane congruent
// to everything before the tail: the crc32 instruction over its 16 bytes (from a zero register)
// reduces it, and the tail continues from there.

// GCC 12's _mm512_undefined_* (inside _mm512_broadcast_i32x4 and _mm512_extracti32x4_epi32)
// trips -Wmaybe-uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// x^n mod P as a raw reflected register (bit b <-> x^(31 - b)).
uint32_t XPowMod(size_t n) {
  uint32_t c = 0x80000000u;
  while (n--) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
  return c;
}

struct FoldConstants {
  uint64_t lo, hi;  // multipliers of a lane's low (earlier) and high qword
  explicit FoldConstants(size_t d_bits)
      : lo(uint64_t{XPowMod(d_bits + 63)} << 32), hi(uint64_t{XPowMod(d_bits - 1)} << 32) {}
};

__attribute__((target("pclmul,sse4.2"))) __m128i Fold128(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

__attribute__((target("avx512f,vpclmulqdq"))) __m512i Fold512(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                   0x96);
}

// Loads 64 bytes at `p` and, when copying, stores them at `d` (the copy rides on the CRC's loads).
template <bool kCopy>
__attribute__((target("avx512f,vpclmulqdq"))) __m512i Load64(const uint8_t* p, uint8_t* d) {
  const __m512i v = _mm512_loadu_si512(p);
  if constexpr (kCopy) _mm512_storeu_si512(d, v);
  return v;
}

template <bool kCopy>
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t ExtendVpclmulImpl(uint32_t crc, uint8_t* d,
                                                                                         const uint8_t* p, size_t n) {
  constexpr size_t kMin = 512;
  if (n < kMin) {
    if constexpr (kCopy) std::memcpy(d, p, n);
    return ExtendSse42(crc, p, n);
  }
  static const FoldConstants k2048(2048), k512(512), k384(384), k256(256), k128(128);
  auto pair = [](const FoldConstants& k) { return _mm_set_epi64x(static_cast<int64_t>(k.hi), static_cast<int64_t>(k.lo)); };
  // Four accumulators over consecutive 64-byte blocks; the raw start register goes into the
  // first 4 message bytes.
  __m512i x0 = _mm512_xor_si512(Load64<kCopy>(p, d), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  __m512i x1 = Load64<kCopy>(p + 64, d + 64), x2 = Load64<kCopy>(p + 128, d + 128), x3 = Load64<kCopy>(p + 192, d + 192);
  p += 256, d += 256, n -= 256;
  const __m512i f256 = _mm512_broadcast_i32x4(pair(k2048));
  while (n >= 256) {
    x0 = Fold512(x0, f256, Load64<kCopy>(p, d));
    x1 = Fold512(x1, f256, Load64<kCopy>(p + 64, d + 64));
    x2 = Fold512(x2, f256, Load64<kCopy>(p + 128, d + 128));
    x3 = Fold512(x3, f256, Load64<kCopy>(p + 192, d + 192));
    p += 256, d += 256, n -= 256;
  }
  const __m512i f64 = _mm512_broadcast_i32x4(pair(k512));
  x1 = Fold512(x0, f64, x1);
  x2 = Fold512(x1, f64, x2);
  x3 = Fold512(x2, f64, x3);
  while (n >= 64) {
    x3 = Fold512(x3, f64, Load64<kCopy>(p, d));
    p += 64, d += 64, n -= 64;
  }
  // The four lanes of x3 (earliest first) into the last one.
  __m128i r = _mm512_extracti32x4_epi32(x3, 3);
  r = Fold128(_mm512_extracti32x4_epi32(x3, 0), pair(k384), r);
  r = Fold128(_mm512_extracti32x4_epi32(x3, 1), pair(k256), r);
  r = Fold128(_mm512_extracti32x4_epi32(x3, 2), pair(k128), r);
  while (n >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(d), v);
    r = Fold128(r, pair(k128), v);
    p += 16, d += 16, n -= 16;
  }
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  if constexpr (kCopy) std::memcpy(d, p, n);
  return ~static_cast<uint32_t>(RawSse42(c, p, n));
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

bool HaveSse42() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
#else
  return false;
#endif
}

bool HaveVpclmul() {
#if defined(__x86_64__)
  static const bool have = HaveSse42() && __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
  return have;
#else
  return false;
#endif
}

Crc32cPath Best() {
  if (HaveVpclmul()) return Crc32cPath::kVpclmul;
  if (HaveSse42()) return Crc32cPath::kSse42;
  return Crc32cPath::kReference;
}

}  // namespace

uint32_t Crc32cReferenceExtend(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n--) c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

bool Crc32cPathAvailable(Crc32cPath path) {
  switch (path) {
    case Crc32cPath::kReference:
      return true;
    case Crc32cPath::kSse42:
      return HaveSse42();
    case Crc32cPath::kVpclmul:
      return HaveVpclmul();
  }
  return false;
}

uint32_t Crc32cExtendWith(Crc32cPath path, uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  (void)p;
#if defined(__x86_64__)
  if (path == Crc32cPath::kVpclmul && HaveVpclmul()) return ExtendVpclmulImpl<false>(crc, nullptr, p, n);
  if (path != Crc32cPath::kReference && HaveSse42()) return ExtendSse42(crc, p, n);
#endif
  return Crc32cReferenceExtend(crc, data, n);
}

uint32_t Crc32cCopyExtendWith(Crc32cPath path, uint32_t crc, void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (path == Crc32cPath::kVpclmul && HaveVpclmul()) {
    return ExtendVpclmulImpl<true>(crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
  }
#endif
  std::memcpy(dst, src, n);
  return Crc32cExtendWith(path, crc, dst, n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const Crc32cPath best = Best();
  return Crc32cExtendWith(best, crc, data, n);
}

uint32_t Crc32cCopyExtend(uint32_t crc, void* dst, const void* src, size_t n) {
  static const Crc32cPath best = Best();
  return Crc32cCopyExtendWith(best, crc, dst, src, n);
}

}  // namespace longhaul::codec
