// TAH-Quant's bit allocation on the device, in one block (group_quant.cu, between the statistics
// and the encode): the n_hi tokens first in the CPU's order get bits_hi, the rest bits_lo; then
// every token's block size and the inclusive scan of the sizes (the block ends), the flagged groups'
// total and the payload size. One launch in place of a key set-up, a device-wide radix sort, the
// sizes and a device-wide scan.
//
// The CPU's order (group_quant.cc, phase 2: nth_element with ties by token index): entropy
// descending (adaptive) or SplitMix64(token) ascending. Both become an unsigned key that ascends in
// that order, ties by index. The selection is a radix select over the keys, 8 bits a pass from the
// top: it finds kth, the n_hi-th smallest key, and `less`, the keys below it; a token is hi when its
// key is below kth, or equal to it and among the first n_hi - less such tokens by index.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/int_util.h"

namespace longhaul::codec::gpu::gqa {

inline constexpr int kAllocThreads = 512;
// 512 threads with 8 tokens each keep every per-token array in registers (73 of them; 1024 threads
// get 64 each and spilled). Either way the kernel takes about 35 us for 8,192 tokens on an H200:
// its instructions, on one SM, are its cost (docs/gpu.md).
inline constexpr int kPer = 8;
inline constexpr int kTile = kAllocThreads * kPer;  // tokens per tile
inline constexpr int kCached = 8192;                // keys kept in shared memory

struct AllocArgs {
  int64_t tokens;
  int64_t n_hi;  // 0..tokens
  bool adaptive;
  int hi, lo;
  int64_t fixed_bytes;  // a block's bytes before its pivots (header and parameters)
  int64_t dim;
};

// Token t's key: ascending in the CPU's order. The entropy's bits (+0 for -0, see TokenStatsKernel)
// mapped so unsigned order is float order, then inverted for descending.
__device__ __forceinline__ uint64_t EntropyKey(float h) {
  const uint32_t b = __float_as_uint(h);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return static_cast<uint64_t>(~ordered);
}

// The keys: the hash computed, the entropy's from shared memory for the first kCached tokens (read
// from the token statistics once), from global memory after them.
struct Keys {
  const TokenInfo* info;
  const uint32_t* cached;
  bool adaptive;
  __device__ uint64_t operator()(int64_t t) const {
    if (!adaptive) return SplitMix64(static_cast<uint64_t>(t));
    return t < kCached ? cached[t] : EntropyKey(info[t].key);
  }
};

// The n_hi-th smallest key (1-based; n_hi in 1..tokens) into *kth, the keys below it into *less.
// Every thread of the block calls it and gets the answer.
__device__ inline void RadixSelect(const Keys& key, const AllocArgs& a, uint64_t* kth, int64_t* less) {
  __shared__ unsigned hist[256];
  __shared__ uint64_t s_prefix;
  __shared__ int64_t s_need, s_less;
  const int tid = threadIdx.x, lane = tid % kWarp;
  if (tid == 0) {
    s_prefix = 0;
    s_need = a.n_hi;  // rank still sought among the keys that match the prefix
    s_less = 0;
  }
  const int top = a.adaptive ? 24 : 56;  // the highest digit's shift (32- or 64-bit keys)
  for (int shift = top; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kAllocThreads) hist[i] = 0;
    __syncthreads();
    const uint64_t prefix = s_prefix;
    const uint64_t hi_mask = shift + 8 >= 64 ? 0 : ~((uint64_t{1} << (shift + 8)) - 1);
    for (int64_t t0 = 0; t0 < a.tokens; t0 += kTile) {
      uint64_t k[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int64_t t = t0 + j * kAllocThreads + tid;
        k[j] = t < a.tokens ? key(t) : 0;
      }
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int64_t t = t0 + j * kAllocThreads + tid;
        const bool match = t < a.tokens && (k[j] & hi_mask) == prefix;
        const unsigned digit = static_cast<unsigned>(k[j] >> shift) & 255u;
        // The lanes with the first matching lane's digit add once (most keys share their top
        // digits), the others one by one.
        const unsigned active = __ballot_sync(kFullMask, match);
        if (active != 0) {
          const int src = __ffs(active) - 1;
          const unsigned d0 = __shfl_sync(kFullMask, digit, src);
          const unsigned same = __ballot_sync(kFullMask, match && digit == d0);
          if (lane == src) atomicAdd(&hist[d0], static_cast<unsigned>(__popc(same)));
          if (match && digit != d0) atomicAdd(&hist[digit], 1u);
        }
      }
    }
    __syncthreads();
    if (tid < kWarp) {  // warp 0: lane l owns digits 8l .. 8l + 7
      unsigned c[8], own = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[8 * lane + j];
        own += c[j];
      }
      unsigned incl = own;
#pragma unroll
      for (int h = 1; h < kWarp; h *= 2) {
        const unsigned o = __shfl_up_sync(kFullMask, incl, h);
        if (lane >= h) incl += o;
      }
      const int64_t need = s_need;
      __syncwarp();  // every lane has read s_need before the picking lane writes it
      const unsigned before = incl - own;
      // The lane whose digits hold the need-th key picks the digit.
      if (static_cast<int64_t>(before) < need && need <= static_cast<int64_t>(incl)) {
        unsigned run = before;
        int d = 0;
        for (; d < 7 && static_cast<int64_t>(run + c[d]) < need; ++d) run += c[d];
        s_prefix = prefix | (static_cast<uint64_t>(8 * lane + d) << shift);
        s_need = need - run;
        s_less += run;
      }
    }
    __syncthreads();
  }
  *kth = s_prefix;
  *less = s_less;
}

// Bits, sizes and ends of every token, in tiles of kTile tokens in index order (thread i takes
// kPer consecutive tokens of a tile). Launched with one block of kAllocThreads threads.
__global__ void __launch_bounds__(kAllocThreads)
    AllocateBits(AllocArgs a, TokenInfo* __restrict__ info, unsigned long long* __restrict__ ends,
                 unsigned long long* __restrict__ transformed, unsigned long long* __restrict__ total) {
  using IntScan = cub::BlockScan<int, kAllocThreads>;
  using SizeScan = cub::BlockScan<unsigned long long, kAllocThreads>;
  __shared__ typename IntScan::TempStorage int_tmp;
  __shared__ typename SizeScan::TempStorage size_tmp;
  __shared__ uint32_t cached[kCached];
  const int tid = threadIdx.x;
  const bool select = a.n_hi > 0 && a.n_hi < a.tokens;
  if (select && a.adaptive) {
    constexpr int kLoads = kCached / kAllocThreads;
    float h[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {  // every load issued before the first store
      const int64_t t = j * kAllocThreads + tid;
      h[j] = t < a.tokens ? info[t].key : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) cached[j * kAllocThreads + tid] = static_cast<uint32_t>(EntropyKey(h[j]));
    __syncthreads();
  }
  const Keys key{info, cached, a.adaptive};
  uint64_t kth = 0;
  int64_t less = 0;
  if (select) RadixSelect(key, a, &kth, &less);
  const int64_t take_equal = a.n_hi - less;  // keys equal to kth that are hi, lowest indices first
  int64_t equal_before = 0;
  unsigned long long carry = 0, flagged_sum = 0;
  for (int64_t t0 = 0; t0 < a.tokens; t0 += kTile) {
    const int64_t first = t0 + static_cast<int64_t>(tid) * kPer;
    int equal[kPer], flagged[kPer];
    bool below[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t t = first + j;
      const bool in = t < a.tokens;
      const uint64_t k = select && in ? key(t) : 0;
      equal[j] = select && in && k == kth ? 1 : 0;
      below[j] = select ? k < kth : a.n_hi >= a.tokens;
      flagged[j] = in ? info[t].flagged : 0;
    }
    int equal_rank[kPer], equal_tile = 0;
    IntScan(int_tmp).ExclusiveSum(equal, equal_rank, equal_tile);
    unsigned long long size[kPer], end[kPer], tile_total = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t t = first + j;
      const bool hi_token = equal[j] != 0 ? equal_before + equal_rank[j] < take_equal : below[j];
      const int bits = hi_token ? a.hi : a.lo;
      size[j] = 0;
      if (t < a.tokens) {
        info[t].bits = bits;
        size[j] = static_cast<unsigned long long>(a.fixed_bytes + flagged[j] + (a.dim * bits + 7) / 8);
        flagged_sum += static_cast<unsigned long long>(flagged[j]);
      }
    }
    SizeScan(size_tmp).InclusiveSum(size, end, tile_total);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (first + j < a.tokens) ends[first + j] = carry + end[j];
    }
    equal_before += equal_tile;
    carry += tile_total;
    __syncthreads();  // the scans' storage is reused by the next tile
  }
  flagged_sum = WarpSumLanes32(flagged_sum);
  if (tid % kWarp == 0 && flagged_sum != 0) atomicAdd(transformed, flagged_sum);
  if (tid == 0) *total = carry;
}

}  // namespace longhaul::codec::gpu::gqa

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
