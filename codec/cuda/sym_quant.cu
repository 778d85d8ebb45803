// Symmetric group quantisation on a CUDA device (gpu_codec.h): byte-identical to
// codec::SymQuantEncode with the scalar kernels, and bit-identical decoding.
//
// Layout of the work: a warp handles one 32-element chunk at a time, lane l element chunk + l, so
// the optional block-32 Walsh-Hadamard transform is a 5-stage shuffle butterfly in the scalar
// Fwht's order, and each 32-chunk's codes are exactly 4 * bits payload bytes. A thread block of
// 256 threads covers a tile of max(G, 256) elements, i.e. whole groups: G <= 256 fits one step
// (several groups per tile for G < 256), larger groups loop over the tile in 256-element steps.
// Encode makes two passes over the tile: the first finds each group's max |y| (max is order
// independent, so any reduction tree gives the CPU's bits), the second recomputes y (the same
// operations, so the same bits; the tile is still in L1/L2) and quantises and packs it.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"
#include "codec/hd.h"
#include "codec/sym_quant.h"

namespace longhaul::codec::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
// The payload lives in the workspace slot every encoder uses for it (group_quant.cu's kPayload),
// valid until the workspace's next encode.
constexpr int kPayloadSlot = Workspace::kSlots - 1;

// The orthonormal WHT of the 32 values of a warp (lane l holds v[l]), stage by stage as the scalar
// Fwht: at stage h the pair (j, j + h), j the lower lane, becomes (a + b, a - b) with a = v[j],
// b = v[j + h]; then every value is multiplied by norm. All 32 lanes must call it.
__device__ __forceinline__ float WarpFwht32(float v, int lane, float norm) {
  for (int h = 1; h < kHadamardBlock; h *= 2) {
    const float o = __shfl_xor_sync(kFullMask, v, h);
    v = (lane & h) != 0 ? o - v : v + o;
  }
  return v * norm;
}

// y of element chunk + lane as the CPU encoder has it before the scale: the input converted to
// float, transformed when `hadamard` and the whole 32-block is inside the tensor (the tensor's
// short tail stays as is), NaN replaced by 0. Lanes past n read 0. All 32 lanes must call it.
template <typename T>
__device__ __forceinline__ float LoadY(const T* x, int64_t chunk, int lane, int64_t n,
                                       bool hadamard, float norm) {
  const int64_t e = chunk + lane;
  float v = e < n ? LoadF(x, e) : 0.0f;
  if (hadamard && chunk + kHadamardBlock <= n) v = WarpFwht32(v, lane, norm);
  if (isnan(v)) v = 0.0f;
  return v;
}

// Packs the 32 codes of a warp's chunk (lane l: code of element chunk + l) into the LSB-first bit
// stream as the scalar Pack does: each run of 8 codes is `bits` bytes; lane l writes byte (l & 7)
// of its run when that byte exists. Bytes at or past code_bytes (past the tensor) are not written;
// codes of elements past n must be 0 so the final partial byte's padding bits are zero.
__device__ __forceinline__ void PackChunk(uint32_t code, int lane, int64_t chunk, int bits,
                                          int64_t code_bytes, uint8_t* codes) {
  const int run = lane & ~7;
  uint64_t w = 0;
  for (int j = 0; j < 8; ++j) {
    w |= static_cast<uint64_t>(__shfl_sync(kFullMask, code, run + j)) << (j * bits);
  }
  const int k = lane & 7;
  if (k < bits) {
    const int64_t byte = (chunk + run) / 8 * bits + k;  // chunk + run is a multiple of 8
    if (byte < code_bytes) codes[byte] = static_cast<uint8_t>(w >> (8 * k));
  }
}

struct EncodeArgs {
  int64_t n;
  int64_t index_offset;
  uint64_t seed;
  int group;
  int bits;
  int qmax;
  bool hadamard;
  bool stochastic;
  float norm;  // HadamardNorm(32), computed on the host exactly as the CPU does
  int64_t code_bytes;
  float* scales;   // payload start (workspace memory: aligned)
  uint8_t* codes;  // payload + 4 * ngroups
};

template <typename T>
__global__ void __launch_bounds__(kThreads) SymEncodeKernel(const T* __restrict__ x, EncodeArgs a) {
  __shared__ float warp_max[kWarps];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t tile = a.group > kThreads ? a.group : kThreads;
  const int steps = static_cast<int>(tile / kThreads);
  const int64_t tile_start = static_cast<int64_t>(blockIdx.x) * tile;

  // Pass 1: max |y| per group. For G <= 256 (one step) lane l holds its own element; for G > 256
  // every element of the tile is in the one group.
  float m = 0.0f;
  for (int st = 0; st < steps; ++st) {
    const int64_t chunk = tile_start + static_cast<int64_t>(st) * kThreads + warp * kWarp;
    m = fmaxf(m, fabsf(LoadY(x, chunk, lane, a.n, a.hadamard, a.norm)));
  }
  // Within the warp: xor partners closer than G lie in the same aligned G-lane segment.
  for (int h = kWarp / 2; h >= 1; h /= 2) {
    if (h < a.group) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, h));
  }
  if (a.group > kWarp) {  // uniform over the block
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    const int per = a.group / kWarp < kWarps ? a.group / kWarp : kWarps;  // warps per group
    const int first = warp - warp % per;
    m = warp_max[first];
    for (int w = first + 1; w < first + per; ++w) m = fmaxf(m, warp_max[w]);
  }
  // Infinities: the CPU sends s = 0 and all-zero values for the group.
  const bool zero_group = !isfinite(m);
  const float s = zero_group ? 0.0f : m;
  const int local0 = warp * kWarp + lane;  // this thread's element of step 0
  if (local0 % a.group == 0 && tile_start + local0 < a.n)
    a.scales[(tile_start + local0) / a.group] = s;

  // Pass 2: quantise and pack, the CPU's float operations in the CPU's order.
  const float inv = s > 0 ? static_cast<float>(a.qmax) / s : 0.0f;
  const float lo = -s;
  const float maxq = static_cast<float>(2 * a.qmax);
  for (int st = 0; st < steps; ++st) {
    const int64_t chunk = tile_start + static_cast<int64_t>(st) * kThreads + warp * kWarp;
    const int64_t e = chunk + lane;
    float y = LoadY(x, chunk, lane, a.n, a.hadamard, a.norm);
    if (zero_group) y = 0.0f;
    uint32_t code;
    if (!a.stochastic) {  // the scalar Quantize
      float r = rintf((y - lo) * inv);
      r = r < 0.0f ? 0.0f : r;
      r = r > maxq ? maxq : r;
      // r is NaN only when inv overflowed to Inf and y == lo (0 * Inf). The CPU's int(NaN) is
      // x86's INT_MIN, whose low byte is 0; say 0 explicitly rather than rely on cvt's NaN -> 0.
      code = isnan(r) ? 0u : static_cast<uint32_t>(static_cast<int>(r));
    } else {  // sym_quant.cc: max(0, min(maxq, floor((y - lo) * inv + u))), std::min/max semantics
      const float c =
          floorf((y - lo) * inv + UniformAt(a.seed, static_cast<uint64_t>(a.index_offset + e)));
      const float t = c < maxq ? c : maxq;                // std::min(maxq, c): maxq when c is NaN
      code = static_cast<uint32_t>(0.0f < t ? t : 0.0f);  // std::max(0.0f, t)
    }
    if (e >= a.n) code = 0;
    PackChunk(code, lane, chunk, a.bits, a.code_bytes, a.codes);
  }
}

// A float stored little-endian at any byte offset (payloads received from the network need not be
// aligned).
__device__ __forceinline__ float LoadScale(const uint8_t* b, int64_t i) {
  const uint8_t* p = b + 4 * i;
  return BitsFloat(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                   static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

// Code of element e from the LSB-first stream (bits <= 8, so it spans at most two bytes).
__device__ __forceinline__ uint32_t LoadCode(const uint8_t* codes, int64_t e, int bits,
                                             int64_t code_bytes) {
  const int64_t bit = e * bits;
  const int64_t byte = bit >> 3;
  uint32_t w = codes[byte];
  if (byte + 1 < code_bytes) w |= static_cast<uint32_t>(codes[byte + 1]) << 8;
  return (w >> (bit & 7)) & ((1u << bits) - 1);
}

struct DecodeArgs {
  int64_t n;
  int group;
  int bits;
  int qmax;
  bool hadamard;
  float norm;
  int64_t code_bytes;
  const uint8_t* scales;
  const uint8_t* codes;
  float* out;
};

// A warp per 32-chunk: dequantise (multiply then add, as the scalar Dequantize) and transform back.
__global__ void __launch_bounds__(kThreads) SymDecodeKernel(DecodeArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t chunk = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp) * kWarp;
  const int64_t e = chunk + lane;
  float y = 0.0f;
  if (e < a.n) {
    const float s = LoadScale(a.scales, e / a.group);
    const float scale = s / static_cast<float>(a.qmax);
    y = static_cast<float>(LoadCode(a.codes, e, a.bits, a.code_bytes)) * scale + -s;
  }
  if (a.hadamard && chunk + kHadamardBlock <= a.n) y = WarpFwht32(y, lane, a.norm);
  if (e < a.n) a.out[e] = y;
}

int64_t NumGroups(int64_t n, int g) { return (n + g - 1) / g; }

}  // namespace

absl::StatusOr<DeviceBytes> SymQuantEncode(const void* x, FrameDtype dtype, int64_t n,
                                           const SymQuantParams& p, uint64_t seed, Workspace& ws,
                                           Stream s, int64_t index_offset) {
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (n < 0) return absl::InvalidArgumentError("symmetric-quant: negative element count");
  const uint64_t bytes = SymQuantPayloadBytes(n, p);
  absl::StatusOr<void*> buf = ws.Scratch(kPayloadSlot, bytes);
  if (!buf.ok()) return buf.status();
  uint8_t* payload = static_cast<uint8_t*>(*buf);
  if (n == 0) return DeviceBytes{payload, 0};

  const int64_t tile = p.group_size > kThreads ? p.group_size : kThreads;
  const int64_t blocks = CeilDiv(n, tile);
  if (blocks > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("symmetric-quant: ", n, " elements"));
  EncodeArgs a;
  a.n = n;
  a.index_offset = index_offset;
  a.seed = seed;
  a.group = p.group_size;
  a.bits = p.bits;
  a.qmax = (1 << (p.bits - 1)) - 1;
  a.hadamard = p.hadamard;
  a.stochastic = p.rounding == Rounding::kStochastic;
  a.norm = HadamardNorm(kHadamardBlock);
  a.code_bytes = PackedBytes(n, p.bits);
  a.scales = reinterpret_cast<float*>(payload);
  a.codes = payload + 4 * NumGroups(n, p.group_size);
  absl::Status st = WithInputType(x, dtype, [&](auto* xt) -> absl::Status {
    SymEncodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(xt, a);
    return CudaStatus(cudaGetLastError(), "symmetric-quant encode launch");
  });
  if (!st.ok()) return st;
  // The size is known without the data: no synchronisation (the copy to the host, on the same
  // stream, waits for the kernel).
  return DeviceBytes{payload, static_cast<size_t>(bytes)};
}

absl::Status SymQuantDecode(const uint8_t* payload, int64_t n, const SymQuantParams& p, float* out,
                            Stream s) {
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (n < 0) return absl::InvalidArgumentError("symmetric-quant: negative element count");
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = CeilDiv(CeilDiv(n, kWarp), kWarps);
  if (blocks > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("symmetric-quant: ", n, " elements"));
  DecodeArgs a;
  a.n = n;
  a.group = p.group_size;
  a.bits = p.bits;
  a.qmax = (1 << (p.bits - 1)) - 1;
  a.hadamard = p.hadamard;
  a.norm = HadamardNorm(kHadamardBlock);
  a.code_bytes = PackedBytes(n, p.bits);
  a.scales = payload;
  a.codes = payload + 4 * NumGroups(n, p.group_size);
  a.out = out;
  SymDecodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(a);
  return CudaStatus(cudaGetLastError(), "symmetric-quant decode launch");
}

}  // namespace longhaul::codec::gpu
