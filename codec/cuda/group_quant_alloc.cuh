// TAH-Quant's bit allocation on the device (group_quant.cu, between the statistics and the encode):
// the n_hi tokens first in the CPU's order get bits_hi, the rest bits_lo; then every token's block
// size and the inclusive scan of the sizes (the block ends), the flagged groups' total, the payload
// size and the first bad token, written straight into the host's pinned results word.
//
// The CPU's order (group_quant.cc, phase 2: nth_element with ties by token index): entropy
// descending (adaptive) or SplitMix64(token) ascending. Both become an unsigned key that ascends in
// that order, ties by index (AllocKey). The selection finds kth, the n_hi-th smallest key, and
// `less`, the keys below it; a token is hi when its key is below kth, or equal to it and among the
// first n_hi - less such tokens by index.
//
// The selection is a radix select in two levels: the statistics pass counts every token's
// top 16 key bits (AllocDigit) in a global histogram of 65,536 bins and their top 8 in one of 256
// (two atomics a token: CountKey), so this block finds the top 16 bits of kth from 256 + 256 bins,
// then the remaining bits 8 at a time over the keys that share them (a few hundred for entropies,
// about one for the hashes) with shared-memory histograms. One block of kAllocThreads threads.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_

#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/int_util.h"

namespace longhaul::codec::gpu::gqa {

inline constexpr int kAllocThreads = 512;
// Tokens per thread and tile in the sizes' pass: 512 threads with 8 tokens each keep every
// per-token array in registers (1,024 threads get 64 registers each and spill).
inline constexpr int kPer = 8;
inline constexpr int kTile = kAllocThreads * kPer;
inline constexpr int kCandidates = 4096;  // keys sharing kth's top digit listed in shared memory
inline constexpr int kDigitBits = 16;  // the global histogram's digit
inline constexpr int kBins = 1 << kDigitBits;
// The coarse histogram (the digit's top 8 bits), after the fine one in the same buffer.
inline constexpr int kCoarseBins = 256;
inline constexpr int kHistWords = kBins + kCoarseBins;
static_assert(kCoarseBins * kCoarseBins == kBins && kCoarseBins <= kAllocThreads, "two 8-bit levels");

// Counts a token's key in both histograms (the statistics pass).
__device__ __forceinline__ void CountKey(unsigned* hist, unsigned digit) {
  atomicAdd(&hist[digit], 1u);
  atomicAdd(&hist[kBins + (digit >> 8)], 1u);
}

// Results the host reads after the one synchronisation (pinned, written by AllocateBits).
struct Results {
  unsigned long long first_bad;  // (token << 1) | huge, or ULLONG_MAX
  unsigned long long transformed;
  unsigned long long total;  // payload bytes
};

struct AllocArgs {
  int64_t tokens;
  int64_t n_hi;  // 0..tokens
  bool adaptive;
  int hi, lo;
  int64_t fixed_bytes;  // a block's bytes before its pivots (header and parameters)
  int64_t dim;
};

// Whether the allocation selects (otherwise every token gets `hi` when n_hi == tokens, else `lo`).
__host__ __device__ inline bool Selects(int64_t n_hi, int64_t tokens) { return n_hi > 0 && n_hi < tokens; }

// The entropy's bits (+0 for -0, see TokenStatsKernel) mapped so unsigned order is float order,
// then inverted for descending.
__device__ __forceinline__ uint64_t EntropyKey(float h) {
  const uint32_t b = __float_as_uint(h);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return static_cast<uint64_t>(~ordered);
}

// Token t's key (h: its entropy), ascending in the CPU's order, and the width of its significant bits.
__device__ __forceinline__ uint64_t AllocKey(bool adaptive, int64_t t, float h) {
  return adaptive ? EntropyKey(h) : SplitMix64(static_cast<uint64_t>(t));
}
__host__ __device__ inline int KeyBits(bool adaptive) { return adaptive ? 32 : 64; }

// The global histogram's bin of a key.
__device__ __forceinline__ unsigned AllocDigit(bool adaptive, uint64_t key) {
  return static_cast<unsigned>(key >> (KeyBits(adaptive) - kDigitBits));
}

// The statistics pass's per-token figures for the allocation, as arrays (a warp's loads of them
// coalesce), and the allocation's bit widths for the encode.
struct TokenArrays {
  float* entropy;    // +0 for -0; 0 without the adaptive option and for a bad token
  int32_t* flagged;  // flagged groups; a bad token: -1 NaN/Inf, -2 huge
  uint8_t* bits;     // set by AllocateBits
};

// The keys: the hash computed, the entropy's from the statistics' array.
struct Keys {
  const float* entropy;
  bool adaptive;
  __device__ uint64_t operator()(int64_t t) const {
    return adaptive ? EntropyKey(entropy[t]) : SplitMix64(static_cast<uint64_t>(t));
  }
};

struct SelectState {
  uint64_t prefix;  // kth's bits found so far
  int64_t need;     // rank still sought among the keys that match the prefix (1-based)
  int64_t less;     // keys below the prefix
};

// Level 1: the top digit of kth from the global histograms, the coarse one first (two loads a
// thread). Every thread of the block calls it.
__device__ inline void SelectTopDigit(const unsigned* hist, const AllocArgs& a, SelectState* s) {
  using Scan = cub::BlockScan<unsigned, kAllocThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ unsigned coarse;
  __shared__ int64_t coarse_less;
  const int tid = threadIdx.x;
  // Every token is counted, so some bin holds rank n_hi; were none to, bin 0 keeps the reads in range.
  if (tid == 0) {
    coarse = 0;
    coarse_less = 0;
  }
  __syncthreads();
  const unsigned c = tid < kCoarseBins ? hist[kBins + tid] : 0u;
  unsigned before = 0;
  Scan(tmp).ExclusiveSum(c, before);
  if (static_cast<int64_t>(before) < a.n_hi && a.n_hi <= static_cast<int64_t>(before) + c) {
    coarse = static_cast<unsigned>(tid);
    coarse_less = before;
  }
  __syncthreads();  // also: the scan's storage is free again
  const int64_t less0 = coarse_less;
  const unsigned fine = coarse * kCoarseBins + static_cast<unsigned>(tid);
  const unsigned f = tid < kCoarseBins ? hist[fine] : 0u;
  Scan(tmp).ExclusiveSum(f, before);
  const int64_t run = less0 + before;
  if (run < a.n_hi && a.n_hi <= run + f) {
    s->prefix = static_cast<uint64_t>(fine) << (KeyBits(a.adaptive) - kDigitBits);
    s->need = a.n_hi - run;
    s->less = run;
  }
  __syncthreads();
}

// Adds the warp's matching lanes to hist[digit]: the lanes with the first match's digit once (the
// top digits of the keys mostly agree), the others each their own (the low ones mostly differ).
// Every lane of the warp calls it.
__device__ __forceinline__ void CountDigits(unsigned* hist, bool match, unsigned digit, int lane) {
  const unsigned active = __ballot_sync(kFullMask, match);
  if (active == 0) return;
  const int src = __ffs(active) - 1;
  const unsigned d0 = __shfl_sync(kFullMask, digit, src);
  const unsigned same = __ballot_sync(kFullMask, match && digit == d0);
  if (lane == src) atomicAdd(&hist[d0], static_cast<unsigned>(__popc(same)));
  if (match && digit != d0) atomicAdd(&hist[digit], 1u);
}

// Level 2: the remaining bits of kth, 8 a pass, over the keys that share its top digit: listed in
// shared memory first (cand: kCandidates; when they fit, else every key is tested in every pass).
// Every thread of the block calls it.
__device__ inline void SelectLowDigits(const Keys& key, const AllocArgs& a, SelectState* s, uint64_t* cand) {
  __shared__ unsigned digits[256];
  __shared__ int ncand;
  const int tid = threadIdx.x, lane = tid % kWarp;
  const int low = KeyBits(a.adaptive) - kDigitBits;  // the bits below the top digit
  const uint64_t top = s->prefix >> low;
  if (tid == 0) ncand = 0;
  __syncthreads();
  // t0 is the same in every thread, so whole warps take each step; kBatch loads in flight.
  constexpr int kBatch = 4;
  for (int64_t t0 = 0; t0 < a.tokens; t0 += kBatch * kAllocThreads) {
    uint64_t k[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t t = t0 + u * kAllocThreads + tid;
      k[u] = t < a.tokens ? key(t) : 0;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const bool match = t0 + u * kAllocThreads + tid < a.tokens && (k[u] >> low) == top;
      const unsigned m = __ballot_sync(kFullMask, match);
      if (m == 0) continue;
      int base = 0;
      if (lane == 0) base = atomicAdd(&ncand, __popc(m));
      base = __shfl_sync(kFullMask, base, 0);
      const int at = base + __popc(m & ((1u << lane) - 1u));
      if (match && at < kCandidates) cand[at] = k[u];
    }
  }
  __syncthreads();
  const int n = ncand;
  const bool listed = n <= kCandidates;
  for (int shift = low - 8; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kAllocThreads) digits[i] = 0;
    __syncthreads();
    const uint64_t prefix = s->prefix;
    const uint64_t hi_mask = ~((uint64_t{1} << (shift + 8)) - 1);
    if (listed) {
      for (int i = tid; i - tid < n; i += kAllocThreads) {
        const uint64_t k = i < n ? cand[i] : 0;
        CountDigits(digits, i < n && (k & hi_mask) == prefix, static_cast<unsigned>(k >> shift) & 255u, lane);
      }
    } else {
      for (int64_t t = tid; t - tid < a.tokens; t += kAllocThreads) {
        const uint64_t k = t < a.tokens ? key(t) : 0;
        CountDigits(digits, t < a.tokens && (k & hi_mask) == prefix, static_cast<unsigned>(k >> shift) & 255u, lane);
      }
    }
    __syncthreads();
    if (tid < kWarp) {  // warp 0: lane l owns digits 8l .. 8l + 7
      unsigned c[8], own = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = digits[8 * lane + j];
        own += c[j];
      }
      unsigned incl = own;
#pragma unroll
      for (int h = 1; h < kWarp; h *= 2) {
        const unsigned o = __shfl_up_sync(kFullMask, incl, h);
        if (lane >= h) incl += o;
      }
      const int64_t need = s->need;
      __syncwarp();  // every lane has read need before the picking lane writes it
      const unsigned before = incl - own;
      if (static_cast<int64_t>(before) < need && need <= static_cast<int64_t>(incl)) {
        unsigned run = before;
        int d = 0;
        for (; d < 7 && static_cast<int64_t>(run + c[d]) < need; ++d) run += c[d];
        s->prefix = prefix | (static_cast<uint64_t>(8 * lane + d) << shift);
        s->need = need - run;
        s->less += run;
      }
    }
    __syncthreads();
  }
}

// Bits (tok.bits), sizes and ends of every token, in tiles of kTile tokens in index order (thread i
// takes kPer consecutive tokens of a tile); the results word into `res` (pinned host memory). hist:
// the statistics pass's histograms (CountKey, when Selects). The arrays of tok and ends are 32-byte
// aligned. Launched with one block of kAllocThreads threads.
__global__ void __launch_bounds__(kAllocThreads)
    AllocateBits(AllocArgs a, TokenArrays tok, const unsigned* hist, unsigned long long* __restrict__ ends,
                 Results* __restrict__ res) {
  using IntScan = cub::BlockScan<int, kAllocThreads>;
  using SizeScan = cub::BlockScan<unsigned long long, kAllocThreads>;
  __shared__ union {
    uint64_t cand[kCandidates];  // the selection's (SelectLowDigits), then the scans'
    typename IntScan::TempStorage ints;
    typename SizeScan::TempStorage sizes;
  } scan_tmp;
  __shared__ SelectState sel;
  __shared__ unsigned long long first_bad;
  const int tid = threadIdx.x;
  const bool select = Selects(a.n_hi, a.tokens);
  // The encode's blocks may start now (a dependent launch: they load their rows while this block
  // works); this block reads the statistics pass's figures, so it waits for that kernel's end.
  LetDependentsStart();
  WaitForPriorGrids();
  if (tid == 0) {
    sel = SelectState{0, a.n_hi, 0};
    first_bad = ULLONG_MAX;
  }
  __syncthreads();
  const Keys key{tok.entropy, a.adaptive};
  if (select) {
    SelectTopDigit(hist, a, &sel);
    SelectLowDigits(key, a, &sel, scan_tmp.cand);
  }
  const uint64_t kth = sel.prefix;
  const int64_t take_equal = a.n_hi - sel.less;  // keys equal to kth that are hi, lowest indices first
  int64_t equal_before = 0;
  unsigned long long carry = 0, flagged_sum = 0, bad = ULLONG_MAX;
  for (int64_t t0 = 0; t0 < a.tokens; t0 += kTile) {
    const int64_t first = t0 + static_cast<int64_t>(tid) * kPer;
    // The thread's kPer tokens whole: 16-byte loads and stores (first is a multiple of kPer).
    const bool whole = first + kPer <= a.tokens;
    int equal[kPer], flagged[kPer];
    float entropy[kPer];
    bool below[kPer];
    if (whole) {
      const int4* f4 = reinterpret_cast<const int4*>(tok.flagged + first);
      const float4* h4 = reinterpret_cast<const float4*>(tok.entropy + first);
#pragma unroll
      for (int q = 0; q < kPer / 4; ++q) {
        const int4 v = f4[q];
        const float4 h = h4[q];
        flagged[4 * q] = v.x;
        flagged[4 * q + 1] = v.y;
        flagged[4 * q + 2] = v.z;
        flagged[4 * q + 3] = v.w;
        entropy[4 * q] = h.x;
        entropy[4 * q + 1] = h.y;
        entropy[4 * q + 2] = h.z;
        entropy[4 * q + 3] = h.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const bool in = first + j < a.tokens;
        flagged[j] = in ? tok.flagged[first + j] : 0;
        entropy[j] = in ? tok.entropy[first + j] : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t t = first + j;
      const bool in = t < a.tokens;
      const uint64_t k = !select || !in ? 0 : a.adaptive ? EntropyKey(entropy[j]) : SplitMix64(static_cast<uint64_t>(t));
      equal[j] = select && in && k == kth ? 1 : 0;
      below[j] = select ? k < kth : a.n_hi >= a.tokens;
      if (flagged[j] < 0) {  // a bad token (the first of the thread's is its lowest)
        if (bad == ULLONG_MAX) bad = (static_cast<unsigned long long>(t) << 1) | (flagged[j] == -2 ? 1ull : 0ull);
        flagged[j] = 0;
      }
    }
    int equal_rank[kPer], equal_tile = 0;
    IntScan(scan_tmp.ints).ExclusiveSum(equal, equal_rank, equal_tile);
    unsigned long long size[kPer], end[kPer], tile_total = 0;
    uint64_t packed_bits = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t t = first + j;
      const bool hi_token = equal[j] != 0 ? equal_before + equal_rank[j] < take_equal : below[j];
      const int bits = hi_token ? a.hi : a.lo;
      size[j] = 0;
      if (t < a.tokens) {
        packed_bits |= static_cast<uint64_t>(bits) << (8 * j);
        size[j] = static_cast<unsigned long long>(a.fixed_bytes + flagged[j] + (a.dim * bits + 7) / 8);
        flagged_sum += static_cast<unsigned long long>(flagged[j]);
      }
    }
    __syncthreads();  // the storage is the sizes' scan's now
    SizeScan(scan_tmp.sizes).InclusiveSum(size, end, tile_total);
    if (whole) {
      static_assert(kPer == 8, "a thread's bit widths are one 8-byte store");
      *reinterpret_cast<uint64_t*>(tok.bits + first) = packed_bits;
      ulonglong2* e2 = reinterpret_cast<ulonglong2*>(ends + first);
#pragma unroll
      for (int q = 0; q < kPer / 2; ++q) e2[q] = make_ulonglong2(carry + end[2 * q], carry + end[2 * q + 1]);
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (first + j < a.tokens) {
          tok.bits[first + j] = static_cast<uint8_t>(packed_bits >> (8 * j));
          ends[first + j] = carry + end[j];
        }
      }
    }
    equal_before += equal_tile;
    carry += tile_total;
    __syncthreads();  // the scans' storage is reused by the next tile
  }
  if (bad != ULLONG_MAX) atomicMin(&first_bad, bad);
  flagged_sum = WarpSumLanes32(flagged_sum);
  __shared__ unsigned long long warp_flagged[kAllocThreads / kWarp];
  if (tid % kWarp == 0) warp_flagged[tid / kWarp] = flagged_sum;
  __syncthreads();
  if (tid == 0) {
    unsigned long long transformed = 0;
    for (int w = 0; w < kAllocThreads / kWarp; ++w) transformed += warp_flagged[w];
    *res = Results{first_bad, transformed, carry};
  }
}

}  // namespace longhaul::codec::gpu::gqa

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
