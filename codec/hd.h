// LONGHAUL_HD marks the small arithmetic helpers that both the CPU reference and the CUDA kernels
// (codec/cuda/) compile, so a GPU-encoded frame is byte-identical to the CPU's: the same source,
// the same IEEE operations in the same order (the CUDA files are compiled with --fmad=false so no
// multiply-add is fused but the explicit ones, cpu/kernels_common.h's Fma). BitCast replaces
// std::memcpy, which device code cannot call.
#ifndef LONGHAUL_CODEC_HD_H_
#define LONGHAUL_CODEC_HD_H_

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LONGHAUL_HD __host__ __device__
#else
#define LONGHAUL_HD
#endif

namespace longhaul::codec {

LONGHAUL_HD inline uint32_t FloatBits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
#endif
}

LONGHAUL_HD inline float BitsFloat(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, 4);
  return v;
#endif
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_HD_H_
