// TAH-Quant's bit allocation on the device (group_quant.cu, between the statistics and the encode):
// the n_hi tokens first in the CPU's order get bits_hi, the rest bits_lo; then every token's block
// end (the inclusive scan of the block sizes), the flagged groups' total, the payload size and the
// first bad token, written straight into the host's pinned results word.
//
// The CPU's order (group_quant.cc, phase 2: nth_element with ties by token index): entropy
// descending (adaptive) or SplitMix64(token) ascending. Both become an unsigned key that ascends in
// that order, ties by index (AllocKey). The selection finds kth, the n_hi-th smallest key, and
// `less`, the keys below it; a token is hi when its key is below kth, or equal to it and among the
// first n_hi - less such tokens by index.
//
// The selection is a radix select in two levels: the statistics pass counts every token's
// top 16 key bits (AllocDigit) in a global histogram of 65,536 bins and their top 8 in one of 256
// (two atomics a token: CountKey), which give the top 16 bits of kth from 256 + 256 bins; the
// remaining bits come 8 at a time from the keys that share them (a few hundred for entropies, about
// one for the hashes) with shared-memory histograms.
//
// Two kernels, each one block of kAllocThreads threads per tile of tokens (TileTokens), so that no
// block walks every token (one block doing it all took 19 us for 8192 tokens on an H200, all of it
// between the statistics pass and the encode):
//  1. AllocateCandidates: kth's top digit (every block), then its tile: the keys below that digit
//     counted, the flagged groups summed and the first bad token (its Tally in the scratch), and
//     the keys that share the digit listed with their tokens (the first kCandidates of them);
//  2. AllocateBits: the rest of kth (every block, from the list; from every token's key when the
//     list overflowed), then its tile's bits and block ends. A block end is linear in the counts
//     of hi tokens and flagged groups before it (BlockEnd), and the counts before the tile are the
//     earlier tiles' tallies plus their listed keys below or equal to kth, so no block waits for
//     another: within the tile, a block scan. The last block writes the results word.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_

#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/int_util.h"

namespace longhaul::codec::gpu::gqa {

inline constexpr int kAllocThreads = 256;  // both kernels' blocks; one token a thread at a time
inline constexpr int kAllocWarps = kAllocThreads / kWarp;
inline constexpr int kMaxTiles = 1024;     // tiles of more than kAllocThreads tokens past this
inline constexpr int kCandidates = 4096;   // keys sharing kth's top digit listed
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
  int64_t tile;  // tokens a block (TileTokens)
};

// Tokens a tile: kAllocThreads, or a multiple of it that keeps the tiles to kMaxTiles.
__host__ __device__ inline int64_t TileTokens(int64_t tokens) {
  constexpr int64_t kMost = int64_t{kAllocThreads} * kMaxTiles;
  const int64_t per = (tokens + kMost - 1) / kMost;
  return kAllocThreads * (per > 0 ? per : 1);
}
__host__ __device__ inline int64_t NumTiles(int64_t tokens) {
  const int64_t tile = TileTokens(tokens);
  return (tokens + tile - 1) / tile;
}

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

// Counts over a run of tokens, added up by Tally + Tally.
struct Tally {
  long long below;  // keys below kth (a tile's: below kth's top digit; every token when all are hi)
  long long equal;  // keys equal to kth
  long long flagged;  // flagged groups of the good tokens
  unsigned long long first_bad;  // (token << 1) | huge, or ULLONG_MAX
};
__device__ __forceinline__ Tally operator+(const Tally& x, const Tally& y) {
  return Tally{x.below + y.below, x.equal + y.equal, x.flagged + y.flagged,
               x.first_bad < y.first_bad ? x.first_bad : y.first_bad};
}
struct TallySum {
  __device__ __forceinline__ Tally operator()(const Tally& x, const Tally& y) const { return x + y; }
};
inline constexpr Tally kNoTally{0, 0, 0, ULLONG_MAX};

// The allocation's device scratch (the encode's kTemp slot). hist and ncand are zeroed before the
// statistics pass when the allocation selects.
struct AllocScratch {
  unsigned hist[kHistWords];
  unsigned ncand;  // keys that share kth's top digit: all counted, the first kCandidates listed
  SelectState top;  // after kth's top digit (AllocateCandidates' block 0)
  Tally tile[kMaxTiles];  // each tile's (AllocateCandidates)
  uint64_t cand_key[kCandidates];
  int32_t cand_token[kCandidates];
};

// Level 1: the top digit of kth from the global histograms, the coarse one first (two loads a
// thread). Every thread of the block calls it, after *s = {0, n_hi, 0} and a barrier.
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

// Level 2: the remaining bits of kth, 8 a pass, over the keys that share its top digit: cand[0, n)
// when they were all listed (n <= kCandidates), else every token's key in every pass. Every
// thread of the block calls it.
__device__ inline void SelectLowDigits(const Keys& key, const AllocArgs& a, SelectState* s, const uint64_t* cand,
                                       unsigned ncand) {
  __shared__ unsigned digits[256];
  const int tid = threadIdx.x, lane = tid % kWarp;
  const int low = KeyBits(a.adaptive) - kDigitBits;  // the bits below the top digit
  const bool listed = ncand <= kCandidates;
  const int n = listed ? static_cast<int>(ncand) : 0;
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

// v summed over the block, in every thread. Every thread calls it.
__device__ __forceinline__ Tally BlockTally(Tally v) {
  __shared__ Tally warp_tally[kAllocWarps];
  for (int h = kWarp / 2; h >= 1; h /= 2) {
    v = v + Tally{__shfl_xor_sync(kFullMask, v.below, h), __shfl_xor_sync(kFullMask, v.equal, h),
                  __shfl_xor_sync(kFullMask, v.flagged, h), __shfl_xor_sync(kFullMask, v.first_bad, h)};
  }
  __syncthreads();  // warp_tally's readers of an earlier call are done
  if (threadIdx.x % kWarp == 0) warp_tally[threadIdx.x / kWarp] = v;
  __syncthreads();
  Tally all = warp_tally[0];
#pragma unroll
  for (int w = 1; w < kAllocWarps; ++w) all = all + warp_tally[w];
  return all;
}

// A warp's matching lanes' keys and tokens appended to the list (one atomic a warp; past
// kCandidates only counted). Every lane of the warp calls it.
__device__ __forceinline__ void ListMatches(AllocScratch* s, bool match, uint64_t k, int64_t t, int lane) {
  const unsigned m = __ballot_sync(kFullMask, match);
  if (m == 0) return;
  unsigned base = 0;
  if (lane == 0) base = atomicAdd(&s->ncand, static_cast<unsigned>(__popc(m)));
  base = __shfl_sync(kFullMask, base, 0);
  const unsigned at = base + static_cast<unsigned>(__popc(m & ((1u << lane) - 1u)));
  if (match && at < kCandidates) {
    s->cand_key[at] = k;
    s->cand_token[at] = static_cast<int32_t>(t);
  }
}

// A tile's tokens, kAllocThreads at a time (thread tid: token first + tid; whole warps take each
// step): each one's flagged groups (bad: < 0) and key. A step's figures are loaded when it is
// taken (the first by the constructor, so that they are in flight while the caller works), by
// ordinary loads: the statistics pass wrote these arrays.
struct TileWalk {
  TokenArrays tok;
  bool keyed, adaptive;
  int64_t end;
  int64_t t;
  int f = 0;
  float h = 0.0f;
  __device__ TileWalk(const TokenArrays& tk, bool with_keys, bool adapt, int64_t first, int64_t last)
      : tok(tk), keyed(with_keys), adaptive(adapt), end(last), t(first + threadIdx.x) {
    Load();
  }
  __device__ void Load() {
    f = t < end ? tok.flagged[t] : 0;
    h = keyed && adaptive && t < end ? tok.entropy[t] : 0.0f;
  }
  __device__ bool in() const { return t < end; }
  __device__ uint64_t key() const { return adaptive ? EntropyKey(h) : SplitMix64(static_cast<uint64_t>(t)); }
  // This token's flagged groups and first bad token (an empty tally where it is past the end).
  __device__ Tally Own() const {
    Tally v = kNoTally;
    if (!in()) return v;
    if (f < 0) {
      v.first_bad = (static_cast<unsigned long long>(t) << 1) | (f == -2 ? 1ull : 0ull);
    } else {
      v.flagged = f;
    }
    return v;
  }
  // Moves to the next step; false past the tile.
  __device__ bool Next() {
    t += kAllocThreads;
    if (t - static_cast<int64_t>(threadIdx.x) >= end) return false;
    Load();
    return true;
  }
};

// Kernel 1 (see the top of the file). hist: the statistics pass's histograms, in s. One block of
// kAllocThreads threads per tile.
__global__ void __launch_bounds__(kAllocThreads) AllocateCandidates(AllocArgs a, TokenArrays tok, AllocScratch* s) {
  __shared__ SelectState sel;
  const int tid = threadIdx.x, lane = tid % kWarp;
  const bool select = Selects(a.n_hi, a.tokens);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.tile;
  const int64_t last = first + a.tile < a.tokens ? first + a.tile : a.tokens;
  // The encode's blocks may start now (a dependent launch: they load their rows while the
  // allocation works); this kernel reads the statistics pass's figures, so it waits for its end.
  LetDependentsStart();
  WaitForPriorGrids();
  TileWalk w(tok, select, a.adaptive, first, last);  // in flight during the top digit's round trips
  if (select) {
    if (tid == 0) sel = SelectState{0, a.n_hi, 0};
    __syncthreads();
    SelectTopDigit(s->hist, a, &sel);
    if (blockIdx.x == 0 && tid == 0) s->top = sel;
  }
  const int low = KeyBits(a.adaptive) - kDigitBits;
  const uint64_t top = select ? sel.prefix >> low : 0;
  Tally sum = kNoTally;
  do {
    Tally v = w.Own();
    if (select) {
      const uint64_t k = w.key();
      v.below = w.in() && (k >> low) < top ? 1 : 0;
      ListMatches(s, w.in() && (k >> low) == top, k, w.t, lane);
    } else {
      v.below = w.in() && a.n_hi >= a.tokens ? 1 : 0;
    }
    sum = sum + v;
  } while (w.Next());
  sum = BlockTally(sum);
  if (tid == 0) s->tile[blockIdx.x] = sum;
}

// Token t's block end from the counts up to and including it (hi: its hi tokens).
__device__ __forceinline__ unsigned long long BlockEnd(const AllocArgs& a, int64_t t, long long hi,
                                                       long long flagged) {
  const long long lo_bytes = (a.dim * a.lo + 7) / 8, hi_bytes = (a.dim * a.hi + 7) / 8;
  return static_cast<unsigned long long>((t + 1) * (a.fixed_bytes + lo_bytes) + flagged + hi * (hi_bytes - lo_bytes));
}

// Kernel 2 (see the top of the file): bits (tok.bits) and ends of its tile's tokens; the last
// block writes the results word into `res` (pinned host memory). One block of kAllocThreads
// threads per tile, as kernel 1.
__global__ void __launch_bounds__(kAllocThreads)
    AllocateBits(AllocArgs a, TokenArrays tok, const AllocScratch* s, unsigned long long* __restrict__ ends,
                 Results* __restrict__ res) {
  using Scan = cub::BlockScan<Tally, kAllocThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint64_t cand[kCandidates];
  __shared__ SelectState sel;
  const int tid = threadIdx.x;
  const bool select = Selects(a.n_hi, a.tokens);
  const unsigned tile = blockIdx.x;
  const int64_t first = static_cast<int64_t>(tile) * a.tile;
  const int64_t last = first + a.tile < a.tokens ? first + a.tile : a.tokens;
  LetDependentsStart();  // the encode's blocks load their rows meanwhile
  WaitForPriorGrids();
  // One round trip: the tile's first tokens, the earlier tiles' tallies, the list's length.
  TileWalk w(tok, select, a.adaptive, first, last);
  Tally before = kNoTally;
  for (unsigned i = tid; i < tile; i += kAllocThreads) before = before + s->tile[i];
  uint64_t kth = 0;
  long long take_equal = 0;  // keys equal to kth that are hi, lowest tokens first
  if (select) {
    const unsigned ncand = s->ncand;
    const bool listed = ncand <= kCandidates;
    if (tid == 0) sel = s->top;
    for (unsigned i = tid; listed && i < ncand; i += kAllocThreads) cand[i] = s->cand_key[i];
    __syncthreads();
    const Keys key{tok.entropy, a.adaptive};
    SelectLowDigits(key, a, &sel, cand, ncand);
    kth = sel.prefix;
    take_equal = a.n_hi - sel.less;
    // The earlier tiles' keys equal to kth or below it that share its top digit: listed, or
    // (when the list overflowed) every earlier key counted here instead of the tallies' `below`.
    if (listed) {
      for (unsigned i = tid; i < ncand; i += kAllocThreads) {
        if (s->cand_token[i] < first) {
          before.below += cand[i] < kth ? 1 : 0;
          before.equal += cand[i] == kth ? 1 : 0;
        }
      }
    } else {
      before.below = 0;
      for (int64_t t = tid; t < first; t += kAllocThreads) {
        const uint64_t k = key(t);
        before.below += k < kth ? 1 : 0;
        before.equal += k == kth ? 1 : 0;
      }
    }
  }
  Tally carry = BlockTally(before);  // the counts before the tile's next step
  do {
    Tally v = w.Own();
    if (w.in()) {
      const uint64_t k = select ? w.key() : 0;
      v.below = (select ? k < kth : a.n_hi >= a.tokens) ? 1 : 0;
      v.equal = select && k == kth ? 1 : 0;
    }
    Tally upto, step;
    Scan(scan_tmp).InclusiveScan(v, upto, TallySum{}, step);
    if (w.in()) {
      const long long equal = carry.equal + upto.equal;  // equal keys up to this one
      const bool hi = v.below != 0 || (v.equal != 0 && equal - 1 < take_equal);
      const long long his = carry.below + upto.below + (equal < take_equal ? equal : take_equal);
      tok.bits[w.t] = static_cast<uint8_t>(hi ? a.hi : a.lo);
      ends[w.t] = BlockEnd(a, w.t, his, carry.flagged + upto.flagged);
    }
    carry = carry + step;
    __syncthreads();  // scan_tmp is reused by the next step
  } while (w.Next());
  if (tile == gridDim.x - 1 && tid == 0) {  // carry: every token's counts
    const long long his = carry.below + (carry.equal < take_equal ? carry.equal : take_equal);
    *res = Results{carry.first_bad, static_cast<unsigned long long>(carry.flagged),
                   BlockEnd(a, a.tokens - 1, his, carry.flagged)};
  }
}

}  // namespace longhaul::codec::gpu::gqa

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
