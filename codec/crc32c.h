// CRC32C (Castagnoli), the checksum in every tensor frame.
//
//   uint32_t c = Crc32c(data, n);             // fastest available (SSE4.2 when the CPU has it)
//   uint32_t r = Crc32cReference(data, n);    // table-driven scalar reference, used by tests
//   c = Crc32cExtend(c, more, m);             // continue over a second buffer
#ifndef LONGHAUL_CODEC_CRC32C_H_
#define LONGHAUL_CODEC_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace longhaul::codec {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cReferenceExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32cReference(const void* data, size_t n) {
  return Crc32cReferenceExtend(0, data, n);
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CRC32C_H_
