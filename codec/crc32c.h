// CRC32C (Castagnoli), the checksum in every tensor frame.
//
//   uint32_t c = Crc32c(data, n);             // fastest available (VPCLMULQDQ, else SSE4.2)
//   uint32_t r = Crc32cReference(data, n);    // table-driven scalar reference, used by tests
//   c = Crc32cExtend(c, more, m);             // continue over a second buffer
//   c = Crc32cCopyExtend(c, dst, src, m);     // memcpy + extend in one pass over the data
#ifndef LONGHAUL_CODEC_CRC32C_H_
#define LONGHAUL_CODEC_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace longhaul::codec {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cReferenceExtend(uint32_t crc, const void* data, size_t n);
// Copies n bytes from src to dst (they must not overlap) and returns Crc32cExtend(crc, src, n), in
// one pass over the data with VPCLMULQDQ. (The receive path appends into std::string buffers,
// which cannot be written before they are initialised, so it checksums each piece right after
// copying it instead, while the piece is in cache: codec::FrameCrc.)
uint32_t Crc32cCopyExtend(uint32_t crc, void* dst, const void* src, size_t n);

// The implementations behind the calls above, chosen once per process by what the CPU has; named
// here so that tests run each against the reference. An unavailable path falls back to the next
// slower one (kVpclmul -> kSse42 -> kReference).
enum class Crc32cPath {
  kReference,  // table-driven, byte at a time
  kSse42,      // the crc32 instruction on three interleaved streams
  kVpclmul,    // carry-less multiply folding on 512-bit registers (AVX-512 + VPCLMULQDQ)
};
bool Crc32cPathAvailable(Crc32cPath path);
uint32_t Crc32cExtendWith(Crc32cPath path, uint32_t crc, const void* data, size_t n);
uint32_t Crc32cCopyExtendWith(Crc32cPath path, uint32_t crc, void* dst, const void* src, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32cReference(const void* data, size_t n) {
  return Crc32cReferenceExtend(0, data, n);
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CRC32C_H_
