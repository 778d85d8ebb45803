// Grouped asymmetric quantisation (int<k>, tahquant) decoded on a CUDA device: the payload of
// group_quant.h (as group_quant.cu encodes it, byte for byte the CPU's), one warp per token
// (DecodeTokens): the groups' parameters, the codes unpacked, the flagged groups' Hadamard
// transform undone in the CPU's butterfly order and their pivot swapped back.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"
#include "codec/cuda/group_quant_group.h"
#include "codec/cuda/group_quant_tokens.cuh"
#include "codec/minifloat.h"

namespace longhaul::codec::gpu {
namespace {

constexpr int kWarpsPerBlock = 8;
// group_quant.cu's kOffsets: the token offsets, never the payload's slot (a decode may read a
// payload an encode left in the workspace).
constexpr int kOffsetsSlot = 5;

// One warp per token, in rounds: lane l of round r decodes the octet o = 32 r + l (elements 8 o ..
// 8 o + 7, whose codes are the `bits` bytes at o * bits), so a group of G elements is a segment of
// L = G / 8 lanes, as in the encoder (group_quant_tokens.cuh). Per octet: its group's parameters,
// the codes, q * scale + lo; for a flagged group the transform (its own inverse) across the segment
// and the pivot swapped back; 32 bytes stored (two 16-byte stores where `vec`).
template <int G>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock)
    DecodeOctets(const uint8_t* __restrict__ payload, const unsigned long long* __restrict__ offsets, int64_t stride,
                 int64_t tokens, int64_t dim, float norm, bool vec, float* __restrict__ out) {
  constexpr int L = G / 8;
  const int lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= tokens) return;
  const uint8_t* blk = payload + (offsets != nullptr ? static_cast<int64_t>(offsets[t]) : t * stride);
  const int bits = blk[0];
  const float from_rel = Pow2(static_cast<int8_t>(blk[1]));
  const int ng = static_cast<int>((dim + G - 1) / G);
  const uint8_t* params = blk + 2;
  int flagged_total = 0;
  for (int gi = lane; gi < ng; gi += kWarp) flagged_total += params[3 * gi + 2] >> 7;
  flagged_total = WarpSumInt(flagged_total);
  const uint8_t* pivots = params + 3 * ng;
  const uint8_t* codes = pivots + flagged_total;
  const uint32_t mask = (1u << bits) - 1;
  float* orow = out + t * dim;
  const int64_t noct = (dim + 7) / 8;
  const bool leader = (lane & (L - 1)) == 0;
  int ordinal_base = 0;
  for (int64_t ob = 0; ob < noct; ob += kWarp) {
    const int64_t o = ob + lane;
    const int64_t e0 = 8 * o;
    const int cnt = e0 >= dim ? 0 : (dim - e0 < 8 ? static_cast<int>(dim - e0) : 8);
    const int64_t gi = e0 / G;
    uint32_t word = 0;
    uint64_t w = 0;
    if (cnt > 0) {
      word = params[3 * gi] | (params[3 * gi + 1] << 8) | (static_cast<uint32_t>(params[3 * gi + 2]) << 16);
      const uint8_t* c = codes + o * bits;
      const int nb = (cnt * bits + 7) / 8;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k < nb) w |= static_cast<uint64_t>(c[k]) << (8 * k);
      }
    }
    const float lo = Mf12Decode(word & 0xFFF) * from_rel;
    const float scale = Mf12Decode((word >> 12) & 0x7FF) * from_rel;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t q = static_cast<uint32_t>(w >> (j * bits)) & mask;
      v[j] = gqt::CodeToFloat(q) * scale + lo;
    }
    const bool flagged = cnt > 0 && (word >> 23) != 0;
    const unsigned m = __ballot_sync(kFullMask, flagged && leader);
    if (m != 0) {
      int piv = -1;
      if (flagged && leader) piv = pivots[ordinal_base + __popc(m & ((1u << lane) - 1u))];
      piv = __shfl_sync(kFullMask, piv, lane & ~(L - 1));
      gqt::SegmentFwht<G>(v, lane, flagged, norm);
      gqt::SegmentSwap<G>(v, lane, piv);
      ordinal_base += __popc(m);
    }
    float* dst = orow + e0;
    if (vec && cnt == 8) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j < cnt) dst[j] = v[j];
      }
    }
  }
}

}  // namespace

absl::Status GroupQuantDecode(const uint8_t* payload, const GroupQuantLayout& layout, int64_t tokens, int64_t dim,
                              const GroupQuantParams& p, float* out, Workspace& ws, Stream s) {
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (tokens == 0 || dim == 0) return absl::OkStatus();
  if (layout.token_offset.size() != static_cast<size_t>(tokens) + 1) {
    return absl::InvalidArgumentError("GPU decode: the layout does not match the token count");
  }
  if (tokens > INT_MAX / 2) return absl::InvalidArgumentError(absl::StrCat(tokens, " tokens: more than the GPU decoder takes"));
  const cudaStream_t st = AsStream(s);
  const int g = p.group_size;
  // One width and no pivots: every block has the same size and the kernel computes the offsets.
  // Otherwise the host's (from the validation) go up through pinned memory, without a synchronisation.
  const int64_t ng = CeilDiv(dim, g);
  const bool fixed = p.bits_hi == p.bits_lo && !p.hadamard;
  const int64_t stride = PivotsOffset(static_cast<int>(ng)) + PackedBytes(dim, p.bits_hi);
  const unsigned long long* offsets = nullptr;
  if (!fixed) {
    absl::StatusOr<void*> off = ws.Scratch(kOffsetsSlot, sizeof(uint64_t) * (tokens + 1));
    if (!off.ok()) return off.status();
    static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "offsets are 64-bit");
    if (absl::Status up = ws.UploadAsync(*off, layout.token_offset.data(), sizeof(uint64_t) * (tokens + 1), s);
        !up.ok()) {
      return up;
    }
    offsets = static_cast<const unsigned long long*>(*off);
  }
  // Two 16-byte stores per octet where every row starts 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(out) % 16 == 0 && dim % 4 == 0;
  return WithGroupSize(g, [&](auto gc) {
    constexpr int G = decltype(gc)::value;
    DecodeOctets<G><<<static_cast<unsigned>(CeilDiv(tokens, kWarpsPerBlock)), kWarp * kWarpsPerBlock, 0, st>>>(
        payload, offsets, stride, tokens, dim, HadamardNorm(G), vec, out);
    return CudaStatus(cudaGetLastError(), "decode kernel");
  });
}

}  // namespace longhaul::codec::gpu
