// Internal to codec/cuda: error mapping, streams, loads of fp32/fp16/bf16 input, warp reductions.
#ifndef LONGHAUL_CODEC_CUDA_CUDA_UTIL_CUH_
#define LONGHAUL_CODEC_CUDA_CUDA_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "codec/cuda/gpu_codec.h"

namespace longhaul::codec::gpu {

inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// Returns from the enclosing function with a Status when a CUDA call fails.
#define LONGHAUL_CUDA_OK(expr)                                                      \
  do {                                                                              \
    if (absl::Status _st = ::longhaul::codec::gpu::CudaStatus((expr), #expr); !_st.ok()) \
      return _st;                                                               \
  } while (0)

inline cudaStream_t AsStream(Stream s) { return static_cast<cudaStream_t>(s); }

// How many blocks of `kernel` (`threads` threads, no dynamic shared memory) the current device
// runs at once: the occupancy API's blocks an SM times the SMs. Cached per kernel and device (the
// queries cost microseconds, before a launch that may take tens). runtime.cu.
absl::StatusOr<int> ResidentBlocks(const void* kernel, int threads);

// Programmatic dependent launches (sm_90 and later): a kernel launched by LaunchDependent may
// start while the kernel before it on the stream still runs, so that its blocks are resident and
// loading what no earlier kernel writes (its input) when that kernel ends. Before it reads
// anything an earlier kernel of the stream writes, it calls WaitForPriorGrids (which returns once
// the kernel before it, and so every earlier one, has finished and its writes are visible), and it
// reads such data by ordinary loads, never through the non-coherent path (ld.global.nc, const
// __restrict__), which assumes data no kernel alive at the same time writes. The kernel before it
// calls LetDependentsStart where the next one may be launched (else it is, as usual, when this one
// ends). LaunchDependent launches as <<<>>> does unless the kernel's code was compiled for sm_90 or
// later (its PTX version: a build for older architectures that a newer device runs by JIT has no
// griddepcontrol instructions, so its launches must stay ordinary). The first kernel of an encode
// is never a dependent one: what came before it on the stream (another codec's kernels) may use the
// same scratch areas.
__device__ __forceinline__ void WaitForPriorGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void LetDependentsStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Whether `kernel`, as the current device runs it, may be a dependent launch: its PTX version is
// 9.0 or later (then so is the device). Cached per kernel and device. runtime.cu.
absl::StatusOr<bool> DependentLaunches(const void* kernel);
template <typename... Params, typename... Args>
absl::Status LaunchDependent(void (*kernel)(Params...), unsigned grid, unsigned threads, cudaStream_t st,
                             const char* what, Args... args) {
  absl::StatusOr<bool> pdl = DependentLaunches(reinterpret_cast<const void*>(kernel));
  if (!pdl.ok()) return pdl.status();
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cfg.attrs = *pdl ? &attr : nullptr;
  cfg.numAttrs = *pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) cudaGetLastError();  // not left for the next launch's check to find
  return CudaStatus(e, what);
}

inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kWarp = 32;

// Calls f(std::integral_constant<int, G>) for a group size G of the octet kernels (8..256, a power
// of two: a group is a segment of G / 8 lanes of a warp); an error for any other size.
template <typename F>
absl::Status WithGroupSize(int g, F&& f) {
  switch (g) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return absl::InvalidArgumentError(absl::StrCat("group size ", g, " is not supported on the GPU"));
}

// Exact conversion of one input element to float (as the CPU path's x.to(float32)).
__device__ __forceinline__ float LoadF(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float LoadF(const __half* x, int64_t i) { return __half2float(x[i]); }
__device__ __forceinline__ float LoadF(const __nv_bfloat16* x, int64_t i) { return __bfloat162float(x[i]); }

// A 16-bit element (little-endian in the loaded word) as a float, exactly as LoadF converts it.
template <typename T>
__device__ __forceinline__ float Widen(uint16_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
}

// An octet of T (8 elements: 32 bytes of fp32, 16 of a 16-bit type) from its 16-byte pieces as
// loaded (p1: the fp32 octet's second half; unused for 16-bit types) into floats.
template <typename T>
__device__ __forceinline__ void OctetFromPieces(uint4 p0, uint4 p1, float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    v[0] = __uint_as_float(p0.x); v[1] = __uint_as_float(p0.y); v[2] = __uint_as_float(p0.z); v[3] = __uint_as_float(p0.w);
    v[4] = __uint_as_float(p1.x); v[5] = __uint_as_float(p1.y); v[6] = __uint_as_float(p1.z); v[7] = __uint_as_float(p1.w);
  } else {
    const uint32_t wd[4] = {p0.x, p0.y, p0.z, p0.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = Widen<T>(static_cast<uint16_t>(wd[k / 2] >> (16 * (k % 2))));
  }
}

// Global loads that stay ahead of a branch (volatile asm, through the read-only path): the
// compiler may sink an ordinary load below a branch that does not need it (an early return), so
// that it starts only after the branch's own load has come back. (ptxas may still move a load
// that does not feed the branch past it; the row's loads, issued first, stay ahead.)
__device__ __forceinline__ uint4 LoadNow16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
// An ordinary (coherent) load: for data an earlier kernel of the stream wrote (after
// WaitForPriorGrids).
__device__ __forceinline__ int16_t LoadNowS16(const int16_t* p) {
  short r;
  asm volatile("ld.global.s16 %0, [%1];\n" : "=h"(r) : "l"(p));
  return r;
}

// Elements e0 .. e0 + 7 of x as floats (those at n or past it: 0). aligned: x starts on 16 bytes,
// and e0 is a multiple of 8, so a whole octet is two 16-byte loads (fp32) or one (16-bit types).
// kNow: the whole octet's loads by LoadNow16.
template <typename T, bool kNow = false>
__device__ __forceinline__ void LoadOctetGlobal(const T* __restrict__ x, int64_t e0, int64_t n, bool aligned,
                                          float (&v)[8]) {
  if (aligned && e0 + 8 <= n) {
    const uint4* p = reinterpret_cast<const uint4*>(x + e0);
    if constexpr (sizeof(T) == 4) {
      if constexpr (kNow) {
        OctetFromPieces<T>(LoadNow16(p), LoadNow16(p + 1), v);
      } else {
        OctetFromPieces<T>(p[0], p[1], v);
      }
    } else {
      OctetFromPieces<T>(kNow ? LoadNow16(p) : p[0], uint4{}, v);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = e0 + j < n ? LoadF(x, e0 + j) : 0.0f;
}

// Calls f(static_cast<const T*>(x)) with T the element type of `dtype`.
template <typename F>
absl::Status WithInputType(const void* x, FrameDtype dtype, F&& f) {
  switch (dtype) {
    case FrameDtype::kFloat32: return f(static_cast<const float*>(x));
    case FrameDtype::kFloat16: return f(static_cast<const __half*>(x));
    case FrameDtype::kBFloat16: return f(static_cast<const __nv_bfloat16*>(x));
  }
  return absl::InvalidArgumentError("GPU codecs take float32, float16 or bfloat16 input");
}

// The CPU's ReduceLanes32 (kernels_common.h) across a warp: lane i holds lane accumulator i; every
// lane ends with the total, bit-identical to the CPU's l[0].
template <typename T>
__device__ __forceinline__ T WarpSumLanes32(T v) {
  for (int h = kWarp / 2; h >= 1; h /= 2) v = v + __shfl_xor_sync(kFullMask, v, h);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int h = kWarp / 2; h >= 1; h /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, h));
  return v;
}
__device__ __forceinline__ int WarpSumInt(int v) {
  for (int h = kWarp / 2; h >= 1; h /= 2) v += __shfl_xor_sync(kFullMask, v, h);
  return v;
}

// The CPU's ReduceLanesAscending (kernels_common.h) over a thread's 8 token lanes: ((l0 + l1) +
// (l2 + l3)) + ((l4 + l5) + (l6 + l7)); also the last levels, over a block's 8 warps.
__device__ __forceinline__ float SumOf8(const float (&l)[8]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
// The next five levels of ReduceLanesAscending, across the warp (lane i holds the sum of its 8
// lanes): xor 1, 2, 4, 8, 16, every lane ending with the warp's sum.
__device__ __forceinline__ float WarpSumAscending(float v) {
  for (int h = 1; h < kWarp; h *= 2) v = v + __shfl_xor_sync(kFullMask, v, h);
  return v;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace longhaul::codec::gpu

#endif  // LONGHAUL_CODEC_CUDA_CUDA_UTIL_CUH_
