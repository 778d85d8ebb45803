#include "codec/crc32c.h"

#include <array>
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
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

bool HaveSse42() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
#else
  return false;
#endif
}

}  // namespace

uint32_t Crc32cReferenceExtend(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n--) c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return ExtendSse42(crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cReferenceExtend(crc, data, n);
}

}  // namespace longhaul::codec
