// Grouped asymmetric quantisation (int<k>, tahquant) on a CUDA device: the payload of
// group_quant.h, byte for byte.
//
// Encoding, in kernels and library calls on one stream:
//   1. TokenStats (one warp per token): sum and max of |x| (32 lanes, the CPU's order), the
//      NaN/Inf/huge check, the token exponent and the entropy (adaptive TAH-Quant).
//   2. bit allocation: a stable radix sort (CUB) of the tokens by entropy (descending) or by the
//      fixed hash (ascending), ties by token index, exactly the set nth_element picks on the CPU;
//   3. with the Hadamard option, GroupFlags (one thread per group): the outlier test, flag[k] and
//      pivot[k] of group k = t * ng + gi; an exclusive scan (CUB) of the flags gives each flagged
//      group its ordinal, hence its pivot's place in the token block and the token's count;
//   4. block sizes and an inclusive scan (CUB) into block ends;
//   5. EncodeGroups (one thread per group): header, params, pivot, codes.
// The groups' work is group_quant_group.h's (shared with the host, which tests it against the CPU
// reference); its kernels here are the barriers around those phases. One thread per group keeps
// many groups' loads in flight, where a warp walking a token's groups had one group's at a time.
// The host synchronises once, to read the payload size and the error word.
//
// Decoding is one warp per token (DecodeTokens).
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"
#include "codec/cuda/group_quant_group.h"
#include "codec/int_util.h"
#include "codec/minifloat.h"

namespace longhaul::codec::gpu {
namespace {

// As in group_quant.cc.
constexpr float kEntropyL1Eps = 1e-12f;
constexpr float kEntropyLogEps = 1e-12f;
constexpr int kMaxGroup = 256;
constexpr int kWarpsPerBlock = 8;

// Results the host reads after the one synchronisation.
struct Results {
  unsigned long long first_bad;  // (token << 1) | huge, or ULLONG_MAX
  unsigned long long transformed;
  unsigned long long total;      // payload bytes
};

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

template <typename T>
__global__ void TokenStats(const T* __restrict__ x, int64_t tokens, int64_t dim, bool entropy,
                           TokenInfo* __restrict__ info, Results* __restrict__ res) {
  const int lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= tokens) return;  // whole warps only
  const T* row = x + t * dim;
  float acc = 0.0f, mx = 0.0f;
  for (int64_t i = lane; i < dim; i += 32) {
    const float a = fabsf(LoadF(row, i));
    acc += a;
    mx = a > mx ? a : mx;
  }
  const float sum = WarpSumLanes32(acc);
  mx = WarpMax(mx);
  if (!isfinite(sum) || mx > 0x1p100f) {
    if (lane == 0) {
      atomicMin(&res->first_bad, (static_cast<unsigned long long>(t) << 1) | (isfinite(sum) ? 1ull : 0ull));
      info[t] = TokenInfo{0.0f, 0, 0, 0, 0, 0};
    }
    return;
  }
  int e2 = 0;
  if (mx > 0.0f) frexpf(mx, &e2);
  e2 = min(max(e2 + 4, kMinTokenExp), kMaxTokenExp);
  float h = 0.0f;
  if (entropy) {
    const float inv_l1 = 1.0f / (sum + kEntropyL1Eps);
    float e = 0.0f;
    for (int64_t i = lane; i < dim; i += 32) {
      const float p = fabsf(LoadF(row, i)) * inv_l1;
      e += p * FastLog2(p + kEntropyLogEps);
    }
    h = -WarpSumLanes32(e) + 0.0f;
  }
  if (lane == 0) info[t] = TokenInfo{h, e2, 0, 1, 0, 0};  // bits: the allocation; flags: BlockSizes
}

__global__ void InitKeys(const TokenInfo* __restrict__ info, int64_t tokens, bool adaptive, float* fkeys,
                         unsigned long long* hkeys, int* idx) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  if (adaptive) {
    fkeys[t] = info[t].key;
  } else {
    hkeys[t] = SplitMix64(static_cast<uint64_t>(t));
  }
  idx[t] = static_cast<int>(t);
}

__global__ void AssignBits(const int* __restrict__ order, int64_t tokens, int64_t n_hi, int hi, int lo,
                           TokenInfo* __restrict__ info) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < tokens) info[order[i]].bits = i < n_hi ? hi : lo;
}

__global__ void AllBits(int64_t tokens, int bits, TokenInfo* __restrict__ info) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < tokens) info[t].bits = bits;
}

// Element i of x as a float, for the staging phase (group_quant_group.h). Host-callable in name
// only: the phases are host-device templates, and this functor is only ever used on the device.
template <typename T>
struct DeviceLoad {
  const T* x;
  LONGHAUL_HD float operator()(int64_t i) const {
#ifdef __CUDA_ARCH__
    return LoadF(x, i);
#else
    (void)i;
    return 0.0f;
#endif
  }
};

// flag[k] and pivot[k] of every group k < groups (one thread each).
template <int G, typename T>
__global__ void __launch_bounds__(GroupGeometry<G>::kGroups)
    GroupFlags(const T* __restrict__ x, int64_t groups, int ng, int64_t dim, float tau, int32_t* __restrict__ flag,
               uint8_t* __restrict__ pivot) {
  __shared__ StageSmem<G> sm;
  const int tid = threadIdx.x;
  const int64_t k = FlagSetup<G>(sm, blockIdx.x, tid, groups, ng, dim);
  __syncthreads();
  StageGroups<G>(sm, tid, DeviceLoad<T>{x});
  __syncthreads();
  FlagSlot<G>(sm, tid, k, groups, tau, flag, pivot);
}

// Token sizes (and each token's flagged count and first ordinal into info); the last thread also
// stores the number of flagged groups. flag and ordinal are null without the Hadamard option.
__global__ void BlockSizes(TokenInfo* __restrict__ info, int64_t tokens, int64_t dim, int ng,
                           const int32_t* __restrict__ flag, const int32_t* __restrict__ ordinal,
                           unsigned long long* __restrict__ sizes, Results* __restrict__ res) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  TokenInfo ti = info[t];
  sizes[t] = TokenBlockBytes(&ti, t, dim, ng, flag, ordinal);
  info[t] = ti;
  if (t == tokens - 1 && flag != nullptr) {
    const int64_t last = tokens * ng - 1;
    res->transformed = static_cast<unsigned long long>(ordinal[last] + flag[last]);
  }
}

// The payload: every group of every good token (one thread each).
template <int G, typename T>
__global__ void __launch_bounds__(GroupGeometry<G>::kGroups) EncodeGroups(const T* __restrict__ x, EncodeArgs a) {
  __shared__ EncodeSmem<G> sm;
  const int tid = threadIdx.x;
  const SlotState st = EncodeSetup<G>(a, sm.stage, blockIdx.x, tid);
  __syncthreads();
  StageGroups<G>(sm.stage, tid, DeviceLoad<T>{x});
  __syncthreads();
  EncodeSlot<G>(a, sm, st, tid);
  __syncthreads();
  WriteCodes<G>(sm, tid, a.payload);
}

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

int Blocks(int64_t n, int per_block) { return static_cast<int>((n + per_block - 1) / per_block); }

// Scratch slots of the workspace, and what they hold during an encode (the decoder uses kOffsets
// only). The bit allocation runs before the flags so that its slots can then hold the flags:
//   kInfo        TokenInfo per token, throughout
//   kKeys        the sort's keys (fp32 entropy or 64-bit hash), then the block sizes
//   kSortedKeys  the sorted keys, then the flags' exclusive scan (int32 per group)
//   kIdx         the sort's token indices, then the flags (int32 per group)
//   kSortedIdx   the sorted token indices (read by AssignBits), then the pivots (u8 per group)
//   kOffsets     the block ends (inclusive scan of the sizes)
//   kTemp        the Results word, then CUB's temporary storage
//   kPayload     the payload (worst case: every group flagged, every token at bits_hi)
enum Slot { kInfo, kKeys, kSortedKeys, kIdx, kSortedIdx, kOffsets, kTemp, kPayload };

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

// Calls f(std::integral_constant<int, G>) for the group size.
template <typename F>
absl::Status WithGroup(int g, F&& f) {
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

}  // namespace

absl::StatusOr<DeviceBytes> GroupQuantEncode(const void* x, FrameDtype dtype, int64_t tokens, int64_t dim,
                                             const GroupQuantParams& p, Workspace& ws, Stream s,
                                             GroupQuantStats* stats) {
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (tokens < 0 || dim < 0) return absl::InvalidArgumentError("negative shape");
  if (tokens > INT_MAX / 2) return absl::InvalidArgumentError(absl::StrCat(tokens, " tokens: more than the GPU encoder takes"));
  if (tokens == 0 || dim == 0) {
    if (stats != nullptr) *stats = {};
    return DeviceBytes{};
  }
  const int g = p.group_size;
  const int64_t ng64 = (dim + g - 1) / g;
  // Group indices, their scans and CUB's item counts are 32-bit.
  if (ng64 > INT_MAX / tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokens, " x ", ng64, " groups: more than the GPU encoder takes"));
  }
  const cudaStream_t st = AsStream(s);
  const int ng = static_cast<int>(ng64);
  const int64_t groups = tokens * ng64;
  const bool two_widths = p.bits_hi != p.bits_lo;
  const bool entropy = two_widths && p.adaptive;
  const bool flags = p.hadamard;
  const float norm = HadamardNorm(g);
  const int64_t max_block = 2 + 4 * static_cast<int64_t>(ng) + PackedBytes(dim, p.bits_hi);
  const int64_t n_hi = two_widths ? std::llround(static_cast<double>(p.ratio) * static_cast<double>(tokens)) : tokens;
  const bool sort = two_widths && n_hi < tokens;
  const int n = static_cast<int>(tokens);

  // CUB's temporary storage: the largest of the sort's and the scans'.
  size_t temp_bytes = 0;
  if (sort) {
    if (p.adaptive) {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairsDescending(
          nullptr, temp_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
          static_cast<const int*>(nullptr), static_cast<int*>(nullptr), n, 0, 32, st));
    } else {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairs(
          nullptr, temp_bytes, static_cast<const unsigned long long*>(nullptr), static_cast<unsigned long long*>(nullptr),
          static_cast<const int*>(nullptr), static_cast<int*>(nullptr), n, 0, 64, st));
    }
  }
  {
    size_t b = 0;
    LONGHAUL_CUDA_OK(cub::DeviceScan::InclusiveSum(nullptr, b, static_cast<const unsigned long long*>(nullptr),
                                                   static_cast<unsigned long long*>(nullptr), n, st));
    temp_bytes = std::max(temp_bytes, b);
  }
  if (flags) {
    size_t b = 0;
    LONGHAUL_CUDA_OK(cub::DeviceScan::ExclusiveSum(nullptr, b, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), static_cast<int>(groups), st));
    temp_bytes = std::max(temp_bytes, b);
  }
  // Every slot before the first launch: growing one synchronises the device.
  constexpr size_t kResultsBytes = 256;  // the results word first, CUB's storage after it (aligned)
  const size_t tok = static_cast<size_t>(tokens), grp = static_cast<size_t>(groups);
  absl::StatusOr<void*> info = ws.Scratch(kInfo, sizeof(TokenInfo) * tok);
  absl::StatusOr<void*> keys = ws.Scratch(kKeys, sizeof(unsigned long long) * tok);
  absl::StatusOr<void*> offsets = ws.Scratch(kOffsets, sizeof(unsigned long long) * tok);
  absl::StatusOr<void*> payload = ws.Scratch(kPayload, static_cast<size_t>(max_block) * tok);
  absl::StatusOr<void*> temp = ws.Scratch(kTemp, kResultsBytes + temp_bytes);
  absl::StatusOr<void*> pinned = ws.Pinned();
  // The sort's slots, then the flags' (see Slot); untouched when neither runs.
  auto maybe = [&](int slot, size_t bytes) -> absl::StatusOr<void*> {
    if (bytes == 0) return static_cast<void*>(nullptr);
    return ws.Scratch(slot, bytes);
  };
  absl::StatusOr<void*> sorted_keys =
      maybe(kSortedKeys, std::max(sort ? sizeof(unsigned long long) * tok : 0, flags ? sizeof(int32_t) * grp : 0));
  absl::StatusOr<void*> idx = maybe(kIdx, std::max(sort ? sizeof(int) * tok : 0, flags ? sizeof(int32_t) * grp : 0));
  absl::StatusOr<void*> sorted_idx = maybe(kSortedIdx, std::max(sort ? sizeof(int) * tok : 0, flags ? grp : 0));
  for (const auto* r : {&info, &keys, &offsets, &payload, &temp, &pinned, &sorted_keys, &idx, &sorted_idx}) {
    if (!r->ok()) return r->status();
  }
  auto* ti = static_cast<TokenInfo*>(*info);
  auto* res = static_cast<Results*>(*pinned);
  auto* dres = static_cast<Results*>(*temp);
  void* cub_temp = static_cast<char*>(*temp) + kResultsBytes;
  const Results init{ULLONG_MAX, 0, 0};
  // From pageable memory: the call returns once `init` has been read.
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(dres, &init, sizeof(init), cudaMemcpyHostToDevice, st));

  absl::Status stats_launched = WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
    TokenStats<<<Blocks(tokens, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, st>>>(xt, tokens, dim, entropy, ti, dres);
    return CudaStatus(cudaGetLastError(), "token statistics kernel");
  });
  if (!stats_launched.ok()) return stats_launched;

  const int elem_blocks = Blocks(tokens, 256);
  if (sort) {
    InitKeys<<<elem_blocks, 256, 0, st>>>(ti, tokens, p.adaptive, static_cast<float*>(*keys),
                                           static_cast<unsigned long long*>(*keys), static_cast<int*>(*idx));
    LONGHAUL_CUDA_OK(cudaGetLastError());
    size_t b = temp_bytes;
    if (p.adaptive) {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairsDescending(
          cub_temp, b, static_cast<const float*>(*keys), static_cast<float*>(*sorted_keys),
          static_cast<const int*>(*idx), static_cast<int*>(*sorted_idx), n, 0, 32, st));
    } else {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairs(
          cub_temp, b, static_cast<const unsigned long long*>(*keys), static_cast<unsigned long long*>(*sorted_keys),
          static_cast<const int*>(*idx), static_cast<int*>(*sorted_idx), n, 0, 64, st));
    }
    AssignBits<<<elem_blocks, 256, 0, st>>>(static_cast<const int*>(*sorted_idx), tokens, n_hi, p.bits_hi,
                                             p.bits_lo, ti);
  } else {
    AllBits<<<elem_blocks, 256, 0, st>>>(tokens, p.bits_hi, ti);
  }
  LONGHAUL_CUDA_OK(cudaGetLastError());

  // The sort's slots are free from here on (stream order): flags, ordinals and pivots.
  int32_t* flag = nullptr;
  int32_t* ordinal = nullptr;
  uint8_t* pivot = nullptr;
  if (flags) {
    flag = static_cast<int32_t*>(*idx);
    ordinal = static_cast<int32_t*>(*sorted_keys);
    pivot = static_cast<uint8_t*>(*sorted_idx);
    absl::Status launched = WithGroup(g, [&](auto gc) {
      return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
        constexpr int kGroups = GroupGeometry<decltype(gc)::value>::kGroups;
        GroupFlags<decltype(gc)::value><<<Blocks(groups, kGroups), kGroups, 0, st>>>(xt, groups, ng, dim, p.tau,
                                                                                      flag, pivot);
        return CudaStatus(cudaGetLastError(), "group flags kernel");
      });
    });
    if (!launched.ok()) return launched;
    size_t b = temp_bytes;
    LONGHAUL_CUDA_OK(cub::DeviceScan::ExclusiveSum(cub_temp, b, flag, ordinal, static_cast<int>(groups), st));
  }
  auto* sz = static_cast<unsigned long long*>(*keys);
  auto* ends = static_cast<unsigned long long*>(*offsets);  // ends[t]: the end of token t's block
  BlockSizes<<<elem_blocks, 256, 0, st>>>(ti, tokens, dim, ng, flag, ordinal, sz, dres);
  LONGHAUL_CUDA_OK(cudaGetLastError());
  {
    size_t b = temp_bytes;
    LONGHAUL_CUDA_OK(cub::DeviceScan::InclusiveSum(cub_temp, b, sz, ends, n, st));
  }
  auto* out = static_cast<uint8_t*>(*payload);
  const EncodeArgs args{tokens, dim, ng, norm, ti, ends, flag, ordinal, pivot, out};
  absl::Status encode_launched = WithGroup(g, [&](auto gc) {
    return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
      constexpr int kGroups = GroupGeometry<decltype(gc)::value>::kGroups;
      EncodeGroups<decltype(gc)::value><<<Blocks(groups, kGroups), kGroups, 0, st>>>(xt, args);
      return CudaStatus(cudaGetLastError(), "encode kernel");
    });
  });
  if (!encode_launched.ok()) return encode_launched;
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(&dres->total, ends + tokens - 1, sizeof(unsigned long long),
                                   cudaMemcpyDeviceToDevice, st));
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(res, dres, sizeof(Results), cudaMemcpyDeviceToHost, st));
  LONGHAUL_CUDA_OK(cudaStreamSynchronize(st));
  if (res->first_bad != ULLONG_MAX) {
    const unsigned long long bad = res->first_bad >> 1;
    return absl::InvalidArgumentError((res->first_bad & 1)
                                          ? absl::StrCat("input magnitude above 2^100 in token ", bad,
                                                         " (use the fp32 codec for such tensors)")
                                          : absl::StrCat("input has a NaN or Inf in token ", bad));
  }
  if (stats != nullptr) {
    stats->groups = groups;
    stats->transformed_groups = static_cast<int64_t>(res->transformed);
    stats->tokens_hi = n_hi;
  }
  return DeviceBytes{out, static_cast<size_t>(res->total)};
}

absl::Status GroupQuantDecode(const uint8_t* payload, const GroupQuantLayout& layout, int64_t tokens, int64_t dim,
                              const GroupQuantParams& p, float* out, Workspace& ws, Stream s) {
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (tokens == 0 || dim == 0) return absl::OkStatus();
  if (layout.token_offset.size() != static_cast<size_t>(tokens) + 1) {
    return absl::InvalidArgumentError("GPU decode: the layout does not match the token count");
  }
  if (tokens > INT_MAX / 2) return absl::InvalidArgumentError(absl::StrCat(tokens, " tokens: more than the GPU decoder takes"));
  const cudaStream_t st = AsStream(s);
  absl::StatusOr<void*> off = ws.Scratch(kOffsets, sizeof(uint64_t) * (tokens + 1));
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
