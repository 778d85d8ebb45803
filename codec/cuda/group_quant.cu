// Grouped asymmetric quantisation (int<k>, tahquant) on a CUDA device: the payload of
// group_quant.h, byte for byte.
//
// One warp per token, in three kernels and two library calls:
//   1. TokenStats: sum and max of |x| (32 lanes, the CPU's order), the NaN/Inf/huge check, the
//      token exponent, the entropy (adaptive TAH-Quant), and how many groups the outlier test will
//      flag (so the block's size is known before it is written).
//   2. bit allocation: a stable radix sort (CUB) of the tokens by entropy (descending) or by the
//      fixed hash (ascending), ties by token index, exactly the set nth_element picks on the CPU;
//   3. block sizes and an inclusive scan (CUB) into block offsets;
//   4. EncodeTokens: per group (a "chunk" of max(G, 32) elements, so a warp holds one group of 32 or
//      more, or 32/G groups of fewer in lane segments): outlier test, pivot swap + Hadamard in
//      shared memory, min/max, mf12 parameters, codes, bit-packing.
// The host synchronises once, to read the payload size and the error word.
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
#include "codec/int_util.h"
#include "codec/minifloat.h"

namespace longhaul::codec::gpu {
namespace {

// As in group_quant.cc.
constexpr float kEntropyL1Eps = 1e-12f;
constexpr float kEntropyLogEps = 1e-12f;
constexpr float kRhoEps = 1e-12f;
constexpr int kMaxGroup = 256;
constexpr int kWarpsPerBlock = 8;

struct TokenInfo {
  float key;        // entropy (+0.0, so that -0 and +0 sort as equal)
  int32_t exp;      // token exponent E
  int32_t flagged;  // groups the outlier test flags
  int32_t bits;     // bit width, set by the allocation
  int32_t ok;       // 0: NaN/Inf/huge (the encode fails; the block is not written)
};

// Results the host reads after the one synchronisation.
struct Results {
  unsigned long long first_bad;  // (token << 1) | huge, or ULLONG_MAX
  unsigned long long transformed;
  unsigned long long total;      // payload bytes
};

// The geometry of a chunk: C = max(G, 32) elements, `per` = C / 32 elements per lane; lanes form
// segments of U = min(G, 32) lanes that each hold one group. Element k * 32 + lane of the chunk is
// the lane's k-th; its group in the chunk is e / G and its index in the group e % G.
// kPer is a template parameter (1, 2, 4 or 8) so the per-lane arrays stay in registers.
template <int kPer>
struct Geo {
  static constexpr int c = 32 * kPer;
  int g, u;
  __device__ explicit Geo(int group) : g(group), u(group < 32 ? group : 32) {}
};

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float SegMax(float v, int u) {
  for (int h = u / 2; h >= 1; h /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, h));
  return v;
}
__device__ __forceinline__ float SegMin(float v, int u) {
  for (int h = u / 2; h >= 1; h /= 2) v = fminf(v, __shfl_xor_sync(kFullMask, v, h));
  return v;
}
__device__ __forceinline__ int SegSum(int v, int u) {
  for (int h = u / 2; h >= 1; h /= 2) v += __shfl_xor_sync(kFullMask, v, h);
  return v;
}
__device__ __forceinline__ int SegMinInt(int v, int u) {
  for (int h = u / 2; h >= 1; h /= 2) v = min(v, __shfl_xor_sync(kFullMask, v, h));
  return v;
}

// The outlier test of the lane's group (Top2Abs, rho > tau) and its pivot (the first index of the
// largest |g_i|). `a` holds the lane's |values| (0 for elements past the tensor's end), `full`
// whether the group is complete. Returns the pivot, or -1 when the group is not flagged.
template <int kPer>
__device__ int OutlierPivot(const float (&a)[kPer], const Geo<kPer>& geo, int lane, bool full, float tau) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) m = a[k] > m ? a[k] : m;
  const float a1 = SegMax(m, geo.u);
  int count = 0, first = INT_MAX;
  float rest = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int idx = (k * 32 + lane) % geo.g;
    if (a[k] == a1) {
      ++count;
      first = min(first, idx);
    } else {
      rest = a[k] > rest ? a[k] : rest;
    }
  }
  count = SegSum(count, geo.u);
  first = SegMinInt(first, geo.u);
  // a2 == a1 when the maximum repeats, else the largest of the others (values are >= 0). Every
  // lane takes part in the shuffles: segments may decide differently.
  const float others = SegMax(rest, geo.u);
  const float a2 = count >= 2 ? a1 : others;
  return full && a1 / (a2 + kRhoEps) > tau ? first : -1;
}

template <int kPer, typename T>
__global__ void TokenStats(const T* __restrict__ x, int64_t tokens, int64_t dim, int g, bool entropy,
                           bool hadamard, float tau, TokenInfo* __restrict__ info, Results* __restrict__ res) {
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
      info[t] = TokenInfo{0.0f, 0, 0, 0, 0};
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
  int flagged = 0;
  if (hadamard) {
    const Geo<kPer> geo(g);
    for (int64_t base = 0; base < dim; base += geo.c) {
      float a[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t e = base + k * 32 + lane;
        a[k] = e < dim ? fabsf(LoadF(row, e)) : 0.0f;
      }
      const int64_t group_start = base + (lane % geo.c) / geo.g * geo.g;  // lane's group (k = 0)
      const bool full = group_start + geo.g <= dim;
      const int piv = OutlierPivot(a, geo, lane, full, tau);
      // Count each flagged group once, at its segment's first lane.
      if (piv >= 0 && lane % geo.u == 0) ++flagged;
    }
    flagged = WarpSumInt(flagged);
  }
  if (lane == 0) {
    info[t] = TokenInfo{h, e2, flagged, 0, 1};
    if (flagged > 0) atomicAdd(&res->transformed, static_cast<unsigned long long>(flagged));
  }
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

__global__ void BlockSizes(const TokenInfo* __restrict__ info, int64_t tokens, int64_t dim, int ng,
                           unsigned long long* __restrict__ sizes) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < tokens) {
    sizes[t] = 2ull + 3ull * ng + static_cast<unsigned long long>(info[t].flagged) +
               static_cast<unsigned long long>((dim * info[t].bits + 7) / 8);
  }
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

// Bit-packs codes[0, n) of a chunk (n <= 256) as kernels' Pack: each run of 8 codes becomes `bits`
// bytes, a final partial run PackedBytes(rem, bits).
__device__ void PackChunk(const uint8_t* codes, int n, int bits, int lane, uint8_t* out) {
  const int runs = (n + 7) / 8;
  for (int r = lane; r < runs; r += 32) {
    const int len = min(8, n - r * 8);
    uint64_t w = 0;
    for (int j = 0; j < len; ++j) w |= static_cast<uint64_t>(codes[r * 8 + j]) << (j * bits);
    const int nb = (len * bits + 7) / 8;
    for (int b = 0; b < nb; ++b) out[r * bits + b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

template <int kPer, typename T>
__global__ void EncodeTokens(const T* __restrict__ x, int64_t tokens, int64_t dim, int g, bool hadamard, float tau,
                             float norm, const TokenInfo* __restrict__ info,
                             const unsigned long long* __restrict__ offsets, uint8_t* __restrict__ payload) {
  __shared__ float s_buf[kWarpsPerBlock][kMaxGroup];
  __shared__ uint8_t s_codes[kWarpsPerBlock][kMaxGroup];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + w;
  if (t >= tokens) return;
  const T* row = x + t * dim;
  const TokenInfo ti = info[t];
  if (!ti.ok) return;  // the encode fails; nothing of this token is read back
  const int ng = static_cast<int>((dim + g - 1) / g);
  uint8_t* blk = payload + (t == 0 ? 0ull : offsets[t - 1]);
  if (lane == 0) {
    blk[0] = static_cast<uint8_t>(ti.bits);
    blk[1] = static_cast<uint8_t>(static_cast<int8_t>(ti.exp));
  }
  uint8_t* params = blk + 2;
  uint8_t* pivots = params + 3 * ng;
  uint8_t* codes_out = pivots + ti.flagged;
  const int maxq = (1 << ti.bits) - 1;
  const float to_rel = Pow2(-ti.exp), from_rel = Pow2(ti.exp);
  const Geo<kPer> geo(g);
  float* buf = s_buf[w];
  uint8_t* cbuf = s_codes[w];
  int flag_ordinal = 0;  // flagged groups before this chunk
  for (int64_t base = 0; base < dim; base += geo.c) {
    float v[kPer];
    bool valid[kPer];
    float a[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t e = base + k * 32 + lane;
      valid[k] = e < dim;
      v[k] = valid[k] ? LoadF(row, e) : 0.0f;
      a[k] = fabsf(v[k]);
    }
    const int seg = (lane % geo.c) / geo.g;  // the lane's group within the chunk
    const int64_t group_start = base + static_cast<int64_t>(seg) * geo.g;
    const int64_t gi = group_start / geo.g;
    const int n = static_cast<int>(Min64(geo.g, dim - group_start));  // <= 0: no group
    const bool leader = lane % geo.u == 0;
    int piv = -1;
    if (hadamard) piv = OutlierPivot(a, geo, lane, n == geo.g, tau);
    const bool flagged = piv >= 0;
    // The flagged group's pivot goes to pivots[ordinal], in group order.
    const unsigned flag_mask = __ballot_sync(kFullMask, flagged && leader);
    if (flagged && leader) pivots[flag_ordinal + __popc(flag_mask & ((1u << lane) - 1))] = static_cast<uint8_t>(piv);
    flag_ordinal += __popc(flag_mask);
    if (__any_sync(kFullMask, flagged)) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) buf[k * 32 + lane] = v[k];
      __syncwarp();
      if (flagged && lane % geo.u == 0) {
        const int s0 = seg * geo.g;
        const float tmp = buf[s0];
        buf[s0] = buf[s0 + piv];
        buf[s0 + piv] = tmp;
      }
      FwhtChunk(buf, geo, lane, flagged, norm);
      if (flagged) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) v[k] = buf[k * 32 + lane];
      }
      __syncwarp();
    }
    // QuantizeGroup (group_quant.cc): mf12 lo rounded down, scale rounded up, codes against them.
    float lo = INFINITY, hi = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (valid[k]) {
        lo = v[k] < lo ? v[k] : lo;
        hi = v[k] > hi ? v[k] : hi;
      }
    }
    lo = SegMin(lo, geo.u);
    hi = SegMax(hi, geo.u);
    const uint16_t lo_code = Mf12Encode(lo * to_rel, RoundDir::kDown);
    const float lo_q = Mf12Decode(lo_code) * from_rel;
    const float scale = (hi - lo_q) / static_cast<float>(maxq);
    const uint16_t s_code = Mf12Encode(scale * to_rel, RoundDir::kUp);
    const float s_q = Mf12Decode(s_code) * from_rel;
    const float inv = s_q > 0.0f ? 1.0f / s_q : 0.0f;
    const float fmaxq = static_cast<float>(maxq);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      float r = rintf((v[k] - lo_q) * inv);
      r = r >= 0.0f ? r : 0.0f;  // NaN (0 * inf when the scale underflows) -> 0, as on the CPU
      r = r > fmaxq ? fmaxq : r;
      cbuf[k * 32 + lane] = static_cast<uint8_t>(static_cast<int>(r));
    }
    if (leader && n > 0) {
      const uint32_t word = static_cast<uint32_t>(lo_code) | (static_cast<uint32_t>(s_code & 0x7FF) << 12) |
                            (flagged ? (1u << 23) : 0u);
      params[3 * gi] = word & 0xFF;
      params[3 * gi + 1] = (word >> 8) & 0xFF;
      params[3 * gi + 2] = (word >> 16) & 0xFF;
    }
    __syncwarp();
    const int chunk_n = static_cast<int>(Min64(geo.c, dim - base));
    PackChunk(cbuf, chunk_n, ti.bits, lane, codes_out + base * ti.bits / 8);
    __syncwarp();
  }
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

// Scratch slots of the workspace.
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
  const cudaStream_t st = AsStream(s);
  const int g = p.group_size;
  const int ng = static_cast<int>((dim + g - 1) / g);
  const bool two_widths = p.bits_hi != p.bits_lo;
  const bool entropy = two_widths && p.adaptive;
  const float norm = HadamardNorm(g);
  const int64_t max_block = 2 + 4 * static_cast<int64_t>(ng) + PackedBytes(dim, p.bits_hi);
  const int64_t n_hi = two_widths ? std::llround(static_cast<double>(p.ratio) * static_cast<double>(tokens)) : tokens;
  const bool sort = two_widths && n_hi < tokens;
  const int n = static_cast<int>(tokens);

  // CUB's temporary storage: the larger of the sort's and the scan's.
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
  constexpr size_t kResultsBytes = 256;  // the results word first, CUB's storage after it (aligned)
  absl::StatusOr<void*> info = ws.Scratch(kInfo, sizeof(TokenInfo) * tokens);
  absl::StatusOr<void*> sizes = ws.Scratch(kKeys, sizeof(unsigned long long) * tokens);
  absl::StatusOr<void*> offsets = ws.Scratch(kOffsets, sizeof(unsigned long long) * tokens);
  absl::StatusOr<void*> payload = ws.Scratch(kPayload, static_cast<size_t>(max_block * tokens));
  absl::StatusOr<void*> temp = ws.Scratch(kTemp, kResultsBytes + temp_bytes);
  absl::StatusOr<void*> pinned = ws.Pinned();
  for (const auto* r : {&info, &sizes, &offsets, &payload, &temp, &pinned}) {
    if (!r->ok()) return r->status();
  }
  auto* ti = static_cast<TokenInfo*>(*info);
  auto* res = static_cast<Results*>(*pinned);
  auto* dres = static_cast<Results*>(*temp);
  void* cub_temp = static_cast<char*>(*temp) + kResultsBytes;
  const Results init{ULLONG_MAX, 0, 0};
  // From pageable memory: the call returns once `init` has been read.
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(dres, &init, sizeof(init), cudaMemcpyHostToDevice, st));

  const int warp_blocks = Blocks(tokens, kWarpsPerBlock);
  const int threads = 32 * kWarpsPerBlock;
  absl::Status stats_launched = WithPer(g, [&](auto per) {
    return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
      TokenStats<decltype(per)::value><<<warp_blocks, threads, 0, st>>>(xt, tokens, dim, g, entropy, p.hadamard,
                                                                        p.tau, ti, dres);
      return CudaStatus(cudaGetLastError(), "token statistics kernel");
    });
  });
  if (!stats_launched.ok()) return stats_launched;

  const int elem_blocks = Blocks(tokens, 256);
  if (sort) {
    // The sort's keys go through the sizes buffer (free until the sizes are computed).
    absl::StatusOr<void*> sorted_keys = ws.Scratch(kSortedKeys, sizeof(unsigned long long) * tokens);
    absl::StatusOr<void*> idx = ws.Scratch(kIdx, sizeof(int) * tokens);
    absl::StatusOr<void*> sorted_idx = ws.Scratch(kSortedIdx, sizeof(int) * tokens);
    for (const auto* r : {&sorted_keys, &idx, &sorted_idx}) {
      if (!r->ok()) return r->status();
    }
    void* keys = *sizes;
    InitKeys<<<elem_blocks, 256, 0, st>>>(ti, tokens, p.adaptive, static_cast<float*>(keys),
                                           static_cast<unsigned long long*>(keys), static_cast<int*>(*idx));
    LONGHAUL_CUDA_OK(cudaGetLastError());
    size_t b = temp_bytes;
    if (p.adaptive) {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairsDescending(
          cub_temp, b, static_cast<const float*>(keys), static_cast<float*>(*sorted_keys),
          static_cast<const int*>(*idx), static_cast<int*>(*sorted_idx), n, 0, 32, st));
    } else {
      LONGHAUL_CUDA_OK(cub::DeviceRadixSort::SortPairs(
          cub_temp, b, static_cast<const unsigned long long*>(keys), static_cast<unsigned long long*>(*sorted_keys),
          static_cast<const int*>(*idx), static_cast<int*>(*sorted_idx), n, 0, 64, st));
    }
    AssignBits<<<elem_blocks, 256, 0, st>>>(static_cast<const int*>(*sorted_idx), tokens, n_hi, p.bits_hi,
                                             p.bits_lo, ti);
  } else {
    AllBits<<<elem_blocks, 256, 0, st>>>(tokens, p.bits_hi, ti);
  }
  LONGHAUL_CUDA_OK(cudaGetLastError());
  auto* sz = static_cast<unsigned long long*>(*sizes);
  auto* ends = static_cast<unsigned long long*>(*offsets);  // ends[t]: the end of token t's block
  BlockSizes<<<elem_blocks, 256, 0, st>>>(ti, tokens, dim, ng, sz);
  LONGHAUL_CUDA_OK(cudaGetLastError());
  {
    size_t b = temp_bytes;
    LONGHAUL_CUDA_OK(cub::DeviceScan::InclusiveSum(cub_temp, b, sz, ends, n, st));
  }
  auto* out = static_cast<uint8_t*>(*payload);
  absl::Status encode_launched = WithPer(g, [&](auto per) {
    return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
      EncodeTokens<decltype(per)::value><<<warp_blocks, threads, 0, st>>>(xt, tokens, dim, g, p.hadamard, p.tau,
                                                                          norm, ti, ends, out);
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
    stats->groups = tokens * ng;
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
