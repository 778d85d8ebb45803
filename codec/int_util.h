// Integer helpers shared by the codec engines (group_quant.cc, sym_quant.cc).
#ifndef LONGHAUL_CODEC_INT_UTIL_H_
#define LONGHAUL_CODEC_INT_UTIL_H_

#include <cstdint>

#include "codec/hd.h"

namespace longhaul::codec {

LONGHAUL_HD inline bool IsPow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// SplitMix64 finaliser: a well-mixed 64-bit hash of x (deterministic on every platform).
LONGHAUL_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_INT_UTIL_H_
