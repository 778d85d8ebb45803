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
// The selection is a radix select in two levels. The statistics pass counts every token's key in
// three global histograms (three atomics a token: CountKey): its top 8 bits (256 bins), its top 16
// (65,536) and its bits 8..23 (65,536), from which the first level reads the top 16 bits of kth
// (256 + 256 bins) and, where every key shares the top 8 (entropies within one octave: the usual
// case), the next 8 (256 more); the remaining bits come 8 at a time from the keys that share those
// (for 8192 tokens of the bench's activations: at most 2,425 share the top 16 bits of their
// entropy, 25 the top 24; about one for the hashes) with shared-memory histograms.
//
// Two kernels, each one block of kAllocThreads threads per tile of tokens (TileTokens), so that no
// block walks every token (one block doing it all took 19 us for 8192 tokens on an H200, all of it
// between the statistics pass and the encode):
//  1. AllocateCandidates: kth's top bits (every block), then its tile: the keys below those bits
//     counted, the flagged groups summed and the first bad token (its Tally), and the keys that
//     share them listed in the tile's own part of the keys array (their count beside it);
//  2. AllocateBits: the rest of kth (every block, from the tiles' lists gathered in order; from
//     every token's key when more than kCandidates share them), then its tile's bits and
//     block ends. A block end is linear in the counts of hi tokens and flagged groups before it
//     (BlockEnd), and the counts before the tile are the earlier tiles' tallies plus their listed
//     keys below or equal to kth, so no block waits for another: within the tile, a block scan. The
//     last block writes the results word. The histograms are cleared here for the next encode
//     (the statistics pass counts into a zeroed area: Workspace::ZeroedScratch).
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
inline constexpr int kCandidates = 4096;   // keys sharing kth's known bits copied into shared memory
inline constexpr int kDigitBits = 16;  // the fine histogram's digit: the key's top 16 bits
inline constexpr int kPrefixBits = 24;  // the bits of a key the histograms see (AllocPrefix)
inline constexpr int kBins = 1 << kDigitBits;
inline constexpr int kCoarseBins = 256;  // the coarse histogram's: the top 8 bits
// The histograms in one buffer: fine, coarse, then the bits 8..23 (as fine's, kBins).
inline constexpr int kCoarseAt = kBins;
inline constexpr int kMidAt = kBins + kCoarseBins;
inline constexpr int kHistWords = kMidAt + kBins;
static_assert(kCoarseBins * kCoarseBins == kBins && kCoarseBins <= kAllocThreads, "8-bit levels");

// Counts a token's key (its top kPrefixBits bits: AllocPrefix) in the three histograms (the
// statistics pass).
__device__ __forceinline__ void CountKey(unsigned* hist, unsigned prefix) {
  atomicAdd(&hist[prefix >> 8], 1u);
  atomicAdd(&hist[kCoarseAt + (prefix >> 16)], 1u);
  atomicAdd(&hist[kMidAt + (prefix & 0xFFFFu)], 1u);
}

// Results the host reads (pinned, written by AllocateBits; the fused int<k> encode copies its own).
// seq is written last: the host polls it for its call's number (AllocArgs::seq) and then reads the
// rest, while the encode kernel still runs.
struct Results {
  unsigned long long first_bad;  // (token << 1) | huge, or ULLONG_MAX
  unsigned long long transformed;
  unsigned long long total;  // payload bytes
  unsigned long long seq;
};

struct AllocArgs {
  int64_t tokens;
  int64_t n_hi;  // 0..tokens
  bool adaptive;
  int hi, lo;
  int64_t fixed_bytes;  // a block's bytes before its pivots (header and parameters)
  int64_t dim;
  int64_t tile;  // tokens a block (TileTokens)
  unsigned long long seq;  // the call's number, written into Results::seq last
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

// A key's top kPrefixBits bits, which the histograms count.
__device__ __forceinline__ unsigned AllocPrefix(bool adaptive, uint64_t key) {
  return static_cast<unsigned>(key >> (KeyBits(adaptive) - kPrefixBits));
}

// The statistics pass's per-token figures for the allocation, as arrays (a warp's loads of them
// coalesce), the allocation's lists of keys and its bit widths for the encode.
struct TokenArrays {
  float* entropy;    // +0 for -0; 0 without the adaptive option and for a bad token
  int32_t* flagged;  // flagged groups; a bad token: -1 NaN/Inf, -2 huge
  uint64_t* keys;    // each tile's listed keys, from its first token on (AllocateCandidates)
  uint8_t* bits;     // set by AllocateBits
};

struct SelectState {
  uint64_t prefix;  // kth's bits found so far (the top `known`, the others 0)
  int64_t need;     // rank still sought among the keys that match the prefix (1-based)
  int64_t less;     // keys below the prefix
  int known;        // 16 or 24 after the first level
};

// Counts over a run of tokens, added up by Tally + Tally.
struct Tally {
  long long below;  // keys below kth (a tile's: below kth's top bits; every token when all are hi)
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

// What the allocation's first kernel leaves for the second (the histograms are apart: kHistWords
// words that are zero between encodes).
struct AllocScratch {
  SelectState top;                // kth's top bits (AllocateCandidates' block 0)
  Tally tile[kMaxTiles];          // each tile's
  unsigned listed[kMaxTiles];     // each tile's keys that share kth's top bits (in TokenArrays::keys)
};

using BinScan = cub::BlockScan<unsigned, kAllocThreads>;

// One step of a radix select over 256 bins: c, this thread's bin count (0 past the bins), less,
// the keys below the first bin. Whether this thread's bin holds rank `need` (1-based), and the
// keys before it (*run). Every thread of the block calls it.
__device__ __forceinline__ bool HoldsRank(unsigned c, int64_t less, int64_t need, BinScan::TempStorage& tmp,
                                          int64_t* run) {
  unsigned before = 0;
  BinScan(tmp).ExclusiveSum(c, before);
  *run = less + before;
  return *run < need && need <= *run + c;
}

// Level 1: the top 16 bits of kth from the global histograms, the coarse one first, then, where
// every key shares the top 8 bits, 8 more from the histogram of the bits 8..23 (restricted to keys
// with kth's bits 8..15: those with kth's top 16, since all share the top 8). One load a thread a
// step. Every thread of the block calls it, after *s = {0, n_hi, 0, 0} and a barrier.
__device__ inline void SelectTopDigit(const unsigned* hist, const AllocArgs& a, SelectState* s) {
  __shared__ BinScan::TempStorage tmp;
  __shared__ unsigned bin;  // the step's bin that holds rank need
  __shared__ int64_t bin_less;
  __shared__ bool one_octave;  // every key shares the top 8 bits
  const int tid = threadIdx.x;
  // Every token is counted, so some bin holds the rank sought; were none to, bin 0 keeps the reads
  // in range.
  if (tid == 0) {
    bin = 0;
    bin_less = 0;
    one_octave = false;
  }
  __syncthreads();
  int64_t run = 0;
  const unsigned c = tid < kCoarseBins ? hist[kCoarseAt + tid] : 0u;
  if (HoldsRank(c, 0, a.n_hi, tmp, &run)) {
    bin = static_cast<unsigned>(tid);
    bin_less = run;
    one_octave = c == a.tokens;
  }
  __syncthreads();  // also: the scan's storage is free again
  const unsigned top8 = bin;
  const int64_t less8 = bin_less;
  __syncthreads();  // every thread has read bin and bin_less
  const unsigned f = tid < kCoarseBins ? hist[top8 * kCoarseBins + static_cast<unsigned>(tid)] : 0u;
  if (HoldsRank(f, less8, a.n_hi, tmp, &run)) {
    bin = static_cast<unsigned>(tid);
    bin_less = run;
  }
  __syncthreads();
  const unsigned top16 = top8 * kCoarseBins + bin;
  const int64_t less16 = bin_less;
  // The 16 bits, which the next step refines where it applies (they stand should no bin of it
  // hold the rank, which consistent counts rule out).
  if (tid == 0) {
    *s = SelectState{static_cast<uint64_t>(top16) << (KeyBits(a.adaptive) - kDigitBits), a.n_hi - less16, less16,
                     kDigitBits};
  }
  __syncthreads();
  if (!one_octave) return;
  const unsigned b2 = top16 & 0xFFu;
  const unsigned m = tid < kCoarseBins ? hist[kMidAt + b2 * kCoarseBins + static_cast<unsigned>(tid)] : 0u;
  if (HoldsRank(m, less16, a.n_hi, tmp, &run)) {
    *s = SelectState{static_cast<uint64_t>(top16 * kCoarseBins + static_cast<unsigned>(tid))
                         << (KeyBits(a.adaptive) - kPrefixBits),
                     a.n_hi - run, run, kPrefixBits};
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

// The keys that share kth's known top bits, in tile order (each tile's list in TokenArrays::keys
// from its first token on; at[i]: the place of tile i's first, at[ntiles]: their count n). Read
// from shared memory where GatherCandidates copied them (n <= kCandidates), else from the lists.
struct Candidates {
  const uint64_t* copied;  // shared memory
  const unsigned* at;      // shared memory, ntiles + 1
  const uint64_t* lists;
  int64_t tile_tokens;
  int ntiles;
  unsigned n;
  __device__ bool Copied() const { return n <= kCandidates; }
  // Where key p is in the lists: the last tile whose first place is at or before p has it.
  __device__ int64_t ListIndex(unsigned p) const {
    int lo = 0, hi = ntiles;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (at[mid] <= p) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return static_cast<int64_t>(lo) * tile_tokens + (p - at[lo]);
  }
  __device__ uint64_t operator[](unsigned p) const { return Copied() ? copied[p] : lists[ListIndex(p)]; }
};

// Level 2: the remaining bits of kth, 8 a pass, over the keys that share its known bits. Every
// thread of the block calls it.
__device__ inline void SelectLowDigits(const Candidates& cand, const AllocArgs& a, SelectState* s) {
  __shared__ unsigned digits[256];
  const int tid = threadIdx.x, lane = tid % kWarp;
  const int low = KeyBits(a.adaptive) - s->known;  // the bits below the known ones
  for (int shift = low - 8; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kAllocThreads) digits[i] = 0;
    __syncthreads();
    const uint64_t prefix = s->prefix;
    const uint64_t hi_mask = ~((uint64_t{1} << (shift + 8)) - 1);
    for (unsigned p = tid; p - tid < cand.n; p += kAllocThreads) {  // whole warps take each step
      const uint64_t k = p < cand.n ? cand[p] : 0;
      CountDigits(digits, p < cand.n && (k & hi_mask) == prefix, static_cast<unsigned>(k >> shift) & 255u, lane);
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

// A warp's matching lanes' keys appended to the block's list (list: the tile's part of the keys
// array, count: its length in shared memory; one atomic a warp). Every lane of the warp calls it.
__device__ __forceinline__ void ListMatches(uint64_t* list, unsigned* count, bool match, uint64_t k, int lane) {
  const unsigned m = __ballot_sync(kFullMask, match);
  if (m == 0) return;
  unsigned base = 0;
  if (lane == 0) base = atomicAdd(count, static_cast<unsigned>(__popc(m)));
  base = __shfl_sync(kFullMask, base, 0);
  if (match) list[base + static_cast<unsigned>(__popc(m & ((1u << lane) - 1u)))] = k;
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
  __device__ uint64_t key() const { return AllocKey(adaptive, t, h); }
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

// Kernel 1 (see the top of the file). hist: the statistics pass's histograms (when Selects). One
// block of kAllocThreads threads per tile.
__global__ void __launch_bounds__(kAllocThreads)
    AllocateCandidates(AllocArgs a, TokenArrays tok, const unsigned* hist, AllocScratch* s) {
  __shared__ SelectState sel;
  __shared__ unsigned listed;
  const int tid = threadIdx.x, lane = tid % kWarp;
  const bool select = Selects(a.n_hi, a.tokens);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.tile;
  const int64_t last = first + a.tile < a.tokens ? first + a.tile : a.tokens;
  // The second kernel's blocks may start now (a dependent launch); this kernel reads the
  // statistics pass's figures, so it waits for its end.
  LetDependentsStart();
  WaitForPriorGrids();
  TileWalk w(tok, select, a.adaptive, first, last);  // in flight during the top bits' round trips
  if (select) {
    if (tid == 0) {
      sel = SelectState{0, a.n_hi, 0, 0};
      listed = 0;
    }
    __syncthreads();
    SelectTopDigit(hist, a, &sel);
    if (blockIdx.x == 0 && tid == 0) s->top = sel;
  }
  const int low = select ? KeyBits(a.adaptive) - sel.known : 0;
  const uint64_t top = select ? sel.prefix >> low : 0;
  Tally sum = kNoTally;
  do {
    Tally v = w.Own();
    if (select) {
      const uint64_t k = w.key();
      v.below = w.in() && (k >> low) < top ? 1 : 0;
      ListMatches(tok.keys + first, &listed, w.in() && (k >> low) == top, k, lane);
    } else {
      v.below = w.in() && a.n_hi >= a.tokens ? 1 : 0;
    }
    sum = sum + v;
  } while (w.Next());
  sum = BlockTally(sum);  // (its barriers: `listed` is final)
  if (tid == 0) {
    s->tile[blockIdx.x] = sum;
    s->listed[blockIdx.x] = select ? listed : 0;
  }
}

// The tiles' lists of keys that share kth's known bits (Candidates): at[] from the tiles' counts,
// and the keys copied into `copied` (shared memory) where they fit. Every thread of the block
// calls it.
__device__ inline Candidates GatherCandidates(const AllocScratch* s, const TokenArrays& tok, int64_t tile_tokens,
                                              int ntiles, uint64_t* copied, unsigned* at) {
  __shared__ BinScan::TempStorage tmp;
  const int tid = threadIdx.x;
  unsigned carry = 0;
  for (int base = 0; base < ntiles; base += kAllocThreads) {
    const int i = base + tid;
    const unsigned c = i < ntiles ? s->listed[i] : 0u;
    unsigned before = 0, all = 0;
    BinScan(tmp).ExclusiveSum(c, before, all);
    if (i < ntiles) at[i] = carry + before;
    carry += all;
    __syncthreads();  // tmp is reused
  }
  if (tid == 0) at[ntiles] = carry;
  __syncthreads();
  const Candidates from_lists{copied, at, tok.keys, tile_tokens, ntiles, carry};
  if (!from_lists.Copied()) return from_lists;
  for (unsigned p = tid; p < carry; p += kAllocThreads) copied[p] = tok.keys[from_lists.ListIndex(p)];
  __syncthreads();
  return from_lists;
}

// Token t's block end from the counts up to and including it (hi: its hi tokens).
__device__ __forceinline__ unsigned long long BlockEnd(const AllocArgs& a, int64_t t, long long hi,
                                                       long long flagged) {
  const long long lo_bytes = (a.dim * a.lo + 7) / 8, hi_bytes = (a.dim * a.hi + 7) / 8;
  return static_cast<unsigned long long>((t + 1) * (a.fixed_bytes + lo_bytes) + flagged + hi * (hi_bytes - lo_bytes));
}

// Kernel 2 (see the top of the file): bits (tok.bits) and ends of its tile's tokens; the last
// block writes the results into `res` (pinned host memory), a.seq last; hist cleared (when
// Selects). One block of kAllocThreads threads per tile, as kernel 1.
__global__ void __launch_bounds__(kAllocThreads)
    AllocateBits(AllocArgs a, TokenArrays tok, const AllocScratch* s, unsigned* hist,
                 unsigned long long* __restrict__ ends, Results* __restrict__ res) {
  using Scan = cub::BlockScan<Tally, kAllocThreads>;
  __shared__ union {
    uint64_t cand[kCandidates];  // the selection's, then the scan's
    typename Scan::TempStorage scan;
  } sm;
  __shared__ unsigned cand_at[kMaxTiles + 1];
  __shared__ SelectState sel;
  const int tid = threadIdx.x;
  const bool select = Selects(a.n_hi, a.tokens);
  const unsigned tile = blockIdx.x;
  const int64_t first = static_cast<int64_t>(tile) * a.tile;
  const int64_t last = first + a.tile < a.tokens ? first + a.tile : a.tokens;
  LetDependentsStart();  // the encode's blocks load their rows meanwhile
  WaitForPriorGrids();
  // One round trip: the tile's first tokens and the earlier tiles' tallies.
  TileWalk w(tok, select, a.adaptive, first, last);
  Tally before = kNoTally;
  for (unsigned i = tid; i < tile; i += kAllocThreads) before = before + s->tile[i];
  uint64_t kth = 0;
  long long take_equal = 0;  // keys equal to kth that are hi, lowest tokens first
  if (select) {
    // The first kernel has read the histograms: cleared for the next encode.
    auto* h4 = reinterpret_cast<uint4*>(hist);
    static_assert(kHistWords % 4 == 0, "the histograms are whole 16-byte pieces");
    for (int i = static_cast<int>(tile * kAllocThreads) + tid; i < kHistWords / 4;
         i += static_cast<int>(gridDim.x * kAllocThreads)) {
      h4[i] = make_uint4(0, 0, 0, 0);
    }
    if (tid == 0) sel = s->top;
    const Candidates cand = GatherCandidates(s, tok, a.tile, static_cast<int>(gridDim.x), sm.cand, cand_at);
    SelectLowDigits(cand, a, &sel);
    kth = sel.prefix;
    take_equal = a.n_hi - sel.less;
    // The earlier tiles' keys equal to kth or below it among those that share its known bits (the
    // tallies counted the keys below those bits): the first cand_at[tile] in tile order.
    for (unsigned p = tid; p < cand_at[tile]; p += kAllocThreads) {
      const uint64_t k = cand[p];
      before.below += k < kth ? 1 : 0;
      before.equal += k == kth ? 1 : 0;
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
    Scan(sm.scan).InclusiveScan(v, upto, TallySum{}, step);
    if (w.in()) {
      const long long equal = carry.equal + upto.equal;  // equal keys up to this one
      const bool hi = v.below != 0 || (v.equal != 0 && equal - 1 < take_equal);
      const long long his = carry.below + upto.below + (equal < take_equal ? equal : take_equal);
      tok.bits[w.t] = static_cast<uint8_t>(hi ? a.hi : a.lo);
      ends[w.t] = BlockEnd(a, w.t, his, carry.flagged + upto.flagged);
    }
    carry = carry + step;
    __syncthreads();  // sm.scan is reused by the next step
  } while (w.Next());
  if (tile == gridDim.x - 1 && tid == 0) {  // carry: every token's counts
    const long long his = carry.below + (carry.equal < take_equal ? carry.equal : take_equal);
    res->first_bad = carry.first_bad;
    res->transformed = static_cast<unsigned long long>(carry.flagged);
    res->total = BlockEnd(a, a.tokens - 1, his, carry.flagged);
    __threadfence_system();  // the figures reach the host before the number that announces them
    *static_cast<volatile unsigned long long*>(&res->seq) = a.seq;
  }
}

}  // namespace longhaul::codec::gpu::gqa

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_ALLOC_CUH_
