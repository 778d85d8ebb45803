// Symmetric group quantisation on a CUDA device (gpu_codec.h): byte-identical to
// codec::SymQuantEncode with the scalar kernels, and bit-identical decoding.
//
// Layout of the work: a warp owns a 256-element piece, held in registers as 8 chunks of 32 (lane l
// holds element chunk + l), so the optional block-32 Walsh-Hadamard transform is a 5-stage shuffle
// butterfly in the scalar Fwht's order. All 8 loads of a piece are issued before any arithmetic
// (memory-level parallelism: one element per thread cannot keep HBM busy). A block of 8 warps spans
// max(G, 2048) elements, i.e. whole groups:
//   G <= 32        a group is a lane segment of one chunk (shuffle reduction inside the segment)
//   32 < G <= 256  a group is G / 32 chunks of one warp (per-chunk warp max, combined in registers)
//   256 < G <= 2048  a group is G / 256 warps (warp max through shared memory)
//   G > 2048       a group is the whole block over several rounds: the maximum is taken in a first
//                  pass, and the second pass recomputes y (same operations, same bits)
// For G <= 2048 encoding is one pass from registers. Max is order independent, so any reduction
// tree gives the CPU's bits. Codes go through shared memory so that lane l packs the 8 codes of
// elements 8l..8l+7 into `bits` consecutive bytes: the warp writes 32 * bits contiguous bytes.
// Decode is the reverse: lane l unpacks its `bits` bytes into shared memory, then every lane
// dequantises element chunk + l of each chunk and transforms back.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

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
constexpr int kChunks = 8;                      // chunks of 32 per warp piece
constexpr int kPiece = kChunks * kWarp;         // 256 elements per warp
constexpr int kBlockSpan = kWarps * kPiece;     // 2048 elements per block round
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

// y of the piece's elements as the CPU encoder has them before the scale: the input converted to
// float, transformed when `hadamard` and the whole 32-block is inside the tensor (the tensor's short
// tail stays as is), NaN replaced by 0. Elements past n are 0. All 32 lanes must call it.
template <typename T>
__device__ __forceinline__ void LoadPiece(const T* __restrict__ x, int64_t piece, int lane, int64_t n,
                                          bool hadamard, float norm, float (&v)[kChunks]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t e = piece + c * kWarp + lane;
    v[c] = e < n ? LoadF(x, e) : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (hadamard && piece + (c + 1) * kWarp <= n) v[c] = WarpFwht32(v[c], lane, norm);
    if (isnan(v[c])) v[c] = 0.0f;
  }
}

__device__ __forceinline__ float PieceMax(const float (&v)[kChunks]) {
  float m = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) m = fmaxf(m, fabsf(v[c]));
  return WarpMax(m);
}

struct EncodeArgs {
  int64_t n;
  int64_t index_offset;
  uint64_t seed;
  int group;
  int group_log2;  // group is a power of two: e >> group_log2 is e's group
  int bits;
  int qmax;
  bool hadamard;
  bool stochastic;
  float norm;  // HadamardNorm(32), computed on the host exactly as the CPU does
  int64_t code_bytes;
  float* scales;   // payload start (workspace memory: aligned)
  uint8_t* codes;  // payload + 4 * ngroups (4-byte aligned)
};

// The scalar Quantize (nearest) or sym_quant.cc's stochastic rounding, the CPU's float operations
// in the CPU's order.
__device__ __forceinline__ uint32_t QuantizeOne(float y, float lo, float inv, float maxq, int64_t e,
                                                const EncodeArgs& a) {
  if (!a.stochastic) {
    float r = rintf((y - lo) * inv);
    r = r < 0.0f ? 0.0f : r;
    r = r > maxq ? maxq : r;
    // r is NaN only when inv overflowed to Inf and y == lo (0 * Inf). The CPU's int(NaN) is x86's
    // INT_MIN, whose low byte is 0; say 0 explicitly rather than rely on cvt's NaN -> 0.
    return isnan(r) ? 0u : static_cast<uint32_t>(static_cast<int>(r));
  }
  // max(0, min(maxq, floor((y - lo) * inv + u))) with std::min/max semantics.
  const float c = floorf((y - lo) * inv + UniformAt(a.seed, static_cast<uint64_t>(a.index_offset + e)));
  const float t = c < maxq ? c : maxq;                 // std::min(maxq, c): maxq when c is NaN
  return static_cast<uint32_t>(0.0f < t ? t : 0.0f);  // std::max(0.0f, t)
}

// Quantises the piece (group maxima m[c] per chunk) and writes its scales and packed codes. `sh` is
// this warp's 256 bytes of shared memory.
__device__ __forceinline__ void QuantizePiece(const float (&v)[kChunks], const float (&m)[kChunks],
                                              int64_t piece, int lane, uint8_t* sh, const EncodeArgs& a) {
  const float maxq = static_cast<float>(2 * a.qmax);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t e = piece + c * kWarp + lane;
    // Infinities: the CPU sends s = 0 and all-zero values for the group.
    const bool zero_group = !isfinite(m[c]);
    const float s = zero_group ? 0.0f : m[c];
    if ((e & (a.group - 1)) == 0 && e < a.n) a.scales[e >> a.group_log2] = s;
    const float inv = s > 0 ? static_cast<float>(a.qmax) / s : 0.0f;
    const uint32_t code = e < a.n ? QuantizeOne(zero_group ? 0.0f : v[c], -s, inv, maxq, e, a) : 0u;
    sh[c * kWarp + lane] = static_cast<uint8_t>(code);
  }
  __syncwarp();
  // Lane l: the codes of elements piece + 8l .. + 7, LSB-first, as the scalar Pack (padding codes
  // past n are 0, so the last partial byte's padding bits are zero).
  const uint64_t eight = *reinterpret_cast<const uint64_t*>(sh + 8 * lane);
  uint64_t w = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) w |= ((eight >> (8 * j)) & 0xffu) << (j * a.bits);
  const int64_t at = (piece / 8 + lane) * a.bits;  // piece is a multiple of 256
  uint8_t* dst = a.codes + at;
  if (a.bits % 4 == 0 && at + a.bits <= a.code_bytes) {  // 4-byte aligned: codes is, and at is
    for (int k = 0; k < a.bits / 4; ++k) reinterpret_cast<uint32_t*>(dst)[k] = static_cast<uint32_t>(w >> (32 * k));
  } else {
    for (int k = 0; k < a.bits; ++k) {
      if (at + k < a.code_bytes) dst[k] = static_cast<uint8_t>(w >> (8 * k));
    }
  }
  __syncwarp();  // sh is reused by the next round
}

template <typename T>
__global__ void __launch_bounds__(kThreads) SymEncodeKernel(const T* __restrict__ x, EncodeArgs a) {
  __shared__ float warp_max[kWarps];
  __shared__ __align__(8) uint8_t codes_sh[kWarps][kPiece];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t span = a.group > kBlockSpan ? a.group : kBlockSpan;
  const int rounds = static_cast<int>(span / kBlockSpan);
  const int64_t first_piece = static_cast<int64_t>(blockIdx.x) * span + warp * kPiece;
  float v[kChunks], m[kChunks];

  if (a.group > kPiece) {
    // The group spans several warps (and, past 2048, several rounds): its maximum goes through
    // shared memory. Every warp of the block takes part (the branch is uniform over the block).
    float t = 0.0f;
    for (int r = 0; r < rounds; ++r) {
      LoadPiece(x, first_piece + static_cast<int64_t>(r) * kBlockSpan, lane, a.n, a.hadamard, a.norm, v);
      t = fmaxf(t, PieceMax(v));
    }
    if (lane == 0) warp_max[warp] = t;
    __syncthreads();
    const int per = a.group / kPiece < kWarps ? a.group / kPiece : kWarps;  // warps per group
    const int lead = warp - warp % per;
    t = warp_max[lead];
    for (int w = lead + 1; w < lead + per; ++w) t = fmaxf(t, warp_max[w]);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) m[c] = t;
    for (int r = 0; r < rounds; ++r) {
      const int64_t piece = first_piece + static_cast<int64_t>(r) * kBlockSpan;
      if (rounds > 1) LoadPiece(x, piece, lane, a.n, a.hadamard, a.norm, v);  // else still in v
      QuantizePiece(v, m, piece, lane, codes_sh[warp], a);
    }
    return;
  }
  LoadPiece(x, first_piece, lane, a.n, a.hadamard, a.norm, v);
  if (a.group <= kWarp) {
    // Xor partners closer than G lie in the same aligned G-lane segment.
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float t = fabsf(v[c]);
      for (int h = kWarp / 2; h >= 1; h /= 2) {
        if (h < a.group) t = fmaxf(t, __shfl_xor_sync(kFullMask, t, h));
      }
      m[c] = t;
    }
  } else {
    float cm[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) cm[c] = WarpMax(fabsf(v[c]));
    const int per = a.group / kWarp;  // chunks per group: 2..8
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int lead = c - c % per;
      float t = cm[lead];
      for (int k = lead + 1; k < lead + per; ++k) t = fmaxf(t, cm[k]);
      m[c] = t;
    }
  }
  QuantizePiece(v, m, first_piece, lane, codes_sh[warp], a);
}

// --- groups of 8..256 elements: a lane per octet ---
// Lane l of a block's round handles the 8 consecutive elements e0 = 8 * octet .. + 7 in registers
// (two 16-byte loads for fp32, one for 16-bit input, when the input is 16-byte aligned), so a group
// is an aligned segment of G / 8 lanes and a Hadamard block of 32 is 4 lanes: its stages 1, 2, 4
// run inside the lane and 8, 16 across lanes (xor 1, 2), 2 shuffles per element where a lane per
// element needed 5, and the group maximum takes log2(G / 8) shuffles per 8 elements. The lane packs
// its 8 codes into `bits` bytes itself: 4-byte stores, the warp writing 32 * bits contiguous bytes.
// The arithmetic per element is LoadPiece's and QuantizePiece's, in the same order.
constexpr int kOctRounds = 2;                          // octets per thread, loaded before any work
constexpr int kOctSpan = kThreads * 8 * kOctRounds;   // elements per block

// Every lane of the warp calls it (shuffles); L = G / 8 lanes per group.
template <int L>
__device__ __forceinline__ void EncodeOctet(float (&v)[8], int64_t e0, int lane, const EncodeArgs& a) {
  if (a.hadamard) {
    // The 32-block of e0 is transformed when it lies inside the tensor (same answer in its 4 lanes).
    const bool full = (e0 & ~int64_t{kHadamardBlock - 1}) + kHadamardBlock <= a.n;
    if (full) {
#pragma unroll
      for (int h = 1; h < 8; h *= 2) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if ((j & h) == 0) {
            const float x0 = v[j], x1 = v[j + h];
            v[j] = x0 + x1;
            v[j + h] = x0 - x1;
          }
        }
      }
    }
#pragma unroll
    for (int h = 1; h < kHadamardBlock / 8; h *= 2) {  // element stages 8 and 16
      const bool upper = (lane & h) != 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float o = __shfl_xor_sync(kFullMask, v[j], h);
        const float nv = upper ? o - v[j] : v[j] + o;
        v[j] = full ? nv : v[j];
      }
    }
    if (full) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * a.norm;
    }
  }
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (isnan(v[j])) v[j] = 0.0f;
    m = fmaxf(m, fabsf(v[j]));
  }
#pragma unroll
  for (int h = 1; h < L; h *= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, h));
  if (e0 >= a.n) return;
  // Infinities: the CPU sends s = 0 and all-zero values for the group.
  const bool zero_group = !isfinite(m);
  const float s = zero_group ? 0.0f : m;
  if ((lane & (L - 1)) == 0) a.scales[e0 >> a.group_log2] = s;
  const float inv = s > 0 ? static_cast<float>(a.qmax) / s : 0.0f;
  const float maxq = static_cast<float>(2 * a.qmax);
  uint64_t w = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t e = e0 + j;
    if (e < a.n) {
      w |= static_cast<uint64_t>(QuantizeOne(zero_group ? 0.0f : v[j], -s, inv, maxq, e, a)) << (j * a.bits);
    }
  }
  // The scalar Pack's bytes (padding codes past n are 0, so are the last byte's padding bits).
  const int64_t at = (e0 >> 3) * a.bits;
  uint8_t* dst = a.codes + at;
  if (a.bits % 4 == 0 && at + a.bits <= a.code_bytes) {  // 4-byte aligned: codes is, and at is
    for (int k = 0; k < a.bits / 4; ++k) reinterpret_cast<uint32_t*>(dst)[k] = static_cast<uint32_t>(w >> (32 * k));
  } else {
    for (int k = 0; k < a.bits; ++k) {
      if (at + k < a.code_bytes) dst[k] = static_cast<uint8_t>(w >> (8 * k));
    }
  }
}

template <int L, typename T>
__global__ void __launch_bounds__(kThreads) SymEncodeOctets(const T* __restrict__ x, EncodeArgs a, bool aligned) {
  const int lane = threadIdx.x % kWarp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kOctRounds * kThreads) + threadIdx.x;
  float v[kOctRounds][8];
#pragma unroll
  for (int r = 0; r < kOctRounds; ++r) LoadOctetGlobal(x, 8 * (first + r * kThreads), a.n, aligned, v[r]);
#pragma unroll
  for (int r = 0; r < kOctRounds; ++r) EncodeOctet<L>(v[r], 8 * (first + r * kThreads), lane, a);
}

// A float stored little-endian at any byte offset (payloads received from the network need not be
// aligned).
__device__ __forceinline__ float LoadScale(const uint8_t* b, int64_t i, bool aligned) {
  if (aligned) return reinterpret_cast<const float*>(b)[i];
  const uint8_t* p = b + 4 * i;
  return BitsFloat(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                   static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

struct DecodeArgs {
  int64_t n;
  int group;
  int group_log2;
  int bits;
  int qmax;
  bool hadamard;
  bool scales_aligned;  // the payload starts on a 4-byte boundary
  float norm;
  int64_t code_bytes;
  const uint8_t* scales;
  const uint8_t* codes;
  float* out;
};

// A warp per 256-element piece: lane l unpacks the `bits` bytes holding the codes of elements
// piece + 8l .. + 7 into shared memory; then each chunk is dequantised (multiply then add, as the
// scalar Dequantize), transformed back and stored, lane l element chunk + l.
__global__ void __launch_bounds__(kThreads) SymDecodeKernel(DecodeArgs a) {
  __shared__ __align__(8) uint8_t codes_sh[kWarps][kPiece];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t piece = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kPiece;
  uint8_t* sh = codes_sh[warp];
  const int64_t at = (piece / 8 + lane) * a.bits;
  uint64_t w = 0;
  for (int k = 0; k < a.bits; ++k) {
    if (at + k < a.code_bytes) w |= static_cast<uint64_t>(a.codes[at + k]) << (8 * k);
  }
  const uint64_t mask = (1u << a.bits) - 1;
  uint64_t eight = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) eight |= ((w >> (j * a.bits)) & mask) << (8 * j);
  *reinterpret_cast<uint64_t*>(sh + 8 * lane) = eight;
  __syncwarp();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t chunk = piece + c * kWarp;
    const int64_t e = chunk + lane;
    float y = 0.0f;
    if (e < a.n) {
      const float s = LoadScale(a.scales, e >> a.group_log2, a.scales_aligned);
      const float scale = s / static_cast<float>(a.qmax);
      y = static_cast<float>(sh[c * kWarp + lane]) * scale + -s;
    }
    if (a.hadamard && chunk + kHadamardBlock <= a.n) y = WarpFwht32(y, lane, a.norm);
    if (e < a.n) a.out[e] = y;
  }
}

int64_t NumGroups(int64_t n, int g) { return (n + g - 1) / g; }

int Log2(int pow2) {
  int k = 0;
  while ((1 << k) < pow2) ++k;
  return k;
}

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

  const bool octets = p.group_size <= 256;
  const int64_t span = octets ? kOctSpan : (p.group_size > kBlockSpan ? p.group_size : kBlockSpan);
  const int64_t blocks = CeilDiv(n, span);
  if (blocks > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("symmetric-quant: ", n, " elements"));
  EncodeArgs a;
  a.n = n;
  a.index_offset = index_offset;
  a.seed = seed;
  a.group = p.group_size;
  a.group_log2 = Log2(p.group_size);
  a.bits = p.bits;
  a.qmax = (1 << (p.bits - 1)) - 1;
  a.hadamard = p.hadamard;
  a.stochastic = p.rounding == Rounding::kStochastic;
  a.norm = HadamardNorm(kHadamardBlock);
  a.code_bytes = PackedBytes(n, p.bits);
  a.scales = reinterpret_cast<float*>(payload);
  a.codes = payload + 4 * NumGroups(n, p.group_size);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  absl::Status st = WithInputType(x, dtype, [&](auto* xt) -> absl::Status {
    if (octets) {
      return WithGroupSize(p.group_size, [&](auto gc) {
        SymEncodeOctets<decltype(gc)::value / 8><<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(xt, a, aligned);
        return CudaStatus(cudaGetLastError(), "symmetric-quant encode launch");
      });
    }
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
  const int64_t blocks = CeilDiv(n, kBlockSpan);
  if (blocks > INT_MAX)
    return absl::InvalidArgumentError(absl::StrCat("symmetric-quant: ", n, " elements"));
  DecodeArgs a;
  a.n = n;
  a.group = p.group_size;
  a.group_log2 = Log2(p.group_size);
  a.bits = p.bits;
  a.qmax = (1 << (p.bits - 1)) - 1;
  a.hadamard = p.hadamard;
  a.scales_aligned = reinterpret_cast<uintptr_t>(payload) % 4 == 0;
  a.norm = HadamardNorm(kHadamardBlock);
  a.code_bytes = PackedBytes(n, p.bits);
  a.scales = payload;
  a.codes = payload + 4 * NumGroups(n, p.group_size);
  a.out = out;
  SymDecodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(a);
  return CudaStatus(cudaGetLastError(), "symmetric-quant decode launch");
}

}  // namespace longhaul::codec::gpu
