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
#include "codec/minifloat.h"

namespace longhaul::codec::gpu {
namespace {

constexpr int kMaxGroup = 256;
constexpr int kWarpsPerBlock = 8;
// group_quant.cu's kOffsets: the token offsets, never the payload's slot (a decode may read a
// payload an encode left in the workspace).
constexpr int kOffsetsSlot = 5;

int Blocks(int64_t n, int per_block) { return static_cast<int>((n + per_block - 1) / per_block); }

// The decoder's warp geometry. A chunk: C = max(G, 32) elements, `per` = C / 32 elements per lane; lanes form
// segments of U = min(G, 32) lanes that each hold one group. Element k * 32 + lane of the chunk is
// the lane's k-th; its group in the chunk is e / G and its index in the group e % G.
// kPer is a template parameter (1, 2, 4 or 8) so the per-lane arrays stay in registers.
template <int kPer>
struct Geo {
  static constexpr int c = 32 * kPer;
  int g, u;
  __device__ explicit Geo(int group) : g(group), u(group < 32 ? group : 32) {}
};

// The orthonormal Walsh-Hadamard transform of each flagged group in `buf` (a warp's chunk), in the
// CPU's butterfly order; every lane runs the same loop (the __syncwarp calls), lanes of unflagged
// groups only skip the arithmetic.
template <int kPer>
__device__ void FwhtChunk(float* buf, const Geo<kPer>& geo, int lane, bool flagged, float norm) {
  const int seg_base = (lane / geo.u) * geo.g;  // the lane's group in the chunk
  const int li = lane % geo.u;
  for (int h = 1; h < geo.g; h *= 2) {
    __syncwarp();
    if (flagged) {
      for (int q = li; q < geo.g / 2; q += geo.u) {
        const int i = seg_base + (q / h) * 2 * h + q % h;
        const float a = buf[i], b = buf[i + h];
        buf[i] = a + b;
        buf[i + h] = a - b;
      }
    }
  }
  __syncwarp();
  if (flagged) {
    for (int q = li; q < geo.g; q += geo.u) buf[seg_base + q] *= norm;
  }
  __syncwarp();
}

template <int kPer>
__global__ void DecodeTokens(const uint8_t* __restrict__ payload, const unsigned long long* __restrict__ offsets,
                             int64_t tokens, int64_t dim, int g, float norm, float* __restrict__ out) {
  __shared__ float s_buf[kWarpsPerBlock][kMaxGroup];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + w;
  if (t >= tokens) return;
  const uint8_t* blk = payload + offsets[t];
  const int bits = blk[0];
  const int exp = static_cast<int8_t>(blk[1]);
  const float from_rel = Pow2(exp);
  const int ng = static_cast<int>((dim + g - 1) / g);
  const uint8_t* params = blk + 2;
  int flagged_total = 0;
  for (int gi = lane; gi < ng; gi += 32) flagged_total += params[3 * gi + 2] >> 7;
  flagged_total = WarpSumInt(flagged_total);
  const uint8_t* pivots = params + 3 * ng;
  const uint8_t* codes = pivots + flagged_total;
  const int64_t code_bytes = (dim * bits + 7) / 8;
  const uint32_t mask = (1u << bits) - 1;
  float* orow = out + t * dim;
  const Geo<kPer> geo(g);
  float* buf = s_buf[w];
  int flag_ordinal = 0;
  for (int64_t base = 0; base < dim; base += geo.c) {
    const int seg = (lane % geo.c) / geo.g;
    const int64_t group_start = base + static_cast<int64_t>(seg) * geo.g;
    const int64_t gi = group_start / geo.g;
    const bool has_group = group_start < dim;
    uint32_t word = 0;
    if (has_group) {
      word = params[3 * gi] | (params[3 * gi + 1] << 8) | (static_cast<uint32_t>(params[3 * gi + 2]) << 16);
    }
    const float lo = Mf12Decode(word & 0xFFF) * from_rel;
    const float scale = Mf12Decode((word >> 12) & 0x7FF) * from_rel;
    const bool flagged = has_group && (word >> 23) != 0;
    const bool leader = lane % geo.u == 0;
    const unsigned flag_mask = __ballot_sync(kFullMask, flagged && leader);
    const int ordinal = flag_ordinal + __popc(flag_mask & ((1u << (lane - lane % geo.u)) - 1));
    flag_ordinal += __popc(flag_mask);
    float v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t e = base + k * 32 + lane;
      v[k] = 0.0f;
      if (e < dim) {
        const int64_t bit = e * bits;
        const int64_t byte = bit >> 3;
        uint32_t word2 = codes[byte];
        if (byte + 1 < code_bytes) word2 |= static_cast<uint32_t>(codes[byte + 1]) << 8;
        const uint32_t q = (word2 >> (bit & 7)) & mask;
        v[k] = static_cast<float>(q) * scale + lo;
      }
    }
    if (__any_sync(kFullMask, flagged)) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) buf[k * 32 + lane] = v[k];
      FwhtChunk(buf, geo, lane, flagged, norm);
      if (flagged && leader) {
        const int s0 = seg * geo.g;
        const int piv = pivots[ordinal];
        const float tmp = buf[s0];
        buf[s0] = buf[s0 + piv];
        buf[s0 + piv] = tmp;
      }
      __syncwarp();
      if (flagged) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) v[k] = buf[k * 32 + lane];
      }
      __syncwarp();
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t e = base + k * 32 + lane;
      if (e < dim) orow[e] = v[k];
    }
  }
}

// Calls f(std::integral_constant<int, kPer>) for the group size's elements per lane.
template <typename F>
absl::Status WithPer(int g, F&& f) {
  switch (g > 32 ? g / 32 : 1) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
  }
  return absl::InvalidArgumentError(absl::StrCat("group size ", g, " is not supported on the GPU"));
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
  absl::StatusOr<void*> off = ws.Scratch(kOffsetsSlot, sizeof(uint64_t) * (tokens + 1));
  if (!off.ok()) return off.status();
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "offsets are 64-bit");
  // From pageable memory: returns once the host vector has been read, so it may go away.
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(*off, layout.token_offset.data(), sizeof(uint64_t) * (tokens + 1),
                                   cudaMemcpyHostToDevice, st));
  const int g = p.group_size;
  return WithPer(g, [&](auto per) {
    DecodeTokens<decltype(per)::value><<<Blocks(tokens, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, st>>>(
        payload, static_cast<const unsigned long long*>(*off), tokens, dim, g, HadamardNorm(g), out);
    return CudaStatus(cudaGetLastError(), "decode kernel");
  });
}

}  // namespace longhaul::codec::gpu
