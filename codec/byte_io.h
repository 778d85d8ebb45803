// Little-endian integer helpers for wire formats (x86 and ARM64 hosts are little-endian; the
// static_assert keeps a big-endian port from silently writing the wrong bytes).
#ifndef LONGHAUL_CODEC_BYTE_IO_H_
#define LONGHAUL_CODEC_BYTE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>

namespace longhaul::codec {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire formats assume a little-endian host");

inline void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<char*>(&v), 4); }
inline void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<char*>(&v), 8); }
inline uint16_t GetU16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t GetU32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t GetU64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline float GetF32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
inline void SetU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void SetF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_BYTE_IO_H_
