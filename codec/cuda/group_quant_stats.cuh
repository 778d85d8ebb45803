// TAH-Quant's statistics pass on the device (group_quant.cu, before the allocation and the
// encode): per token, the sums of |x| and |x| log2 |x| in the CPU's 2048-lane order (kernels.h
// token_sums), the maximum, the entropy (TokenEntropy), the outlier test of every group, and the
// allocation key counted in the histograms (group_quant_alloc.cuh). A block of 256 threads takes
// several tokens in turn, each row read once.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_STATS_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_STATS_CUH_

#include <cstdint>

#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_alloc.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/cuda/group_quant_tokens.cuh"

namespace longhaul::codec::gpu::gqs {

using gqt::kThreads;
static_assert(gqt::kWarps == 8, "a token's last levels of the sums are SumOf8 over the block's warps");

// Adds the octet v (thread tid's o-th) into the thread's token lanes, with its groups' outlier
// test first when `flags` (a group: L = G / 8 lanes of a warp; every lane of the warp calls it).
template <int G>
struct StatsLanes {
  float sum[8] = {}, alog[8] = {};
  float mx = 0.0f;
  int wcount = 0;  // flagged groups the warp saw (the same in every lane)

  __device__ __forceinline__ void Add(const float (&v)[8], int o, int dim, int lane, bool entropy, bool flags,
                                      float tau, int16_t* __restrict__ token_pivots) {
    constexpr int L = G / 8;
    if (flags) {
      const int gs = (8 * o) & ~(G - 1);
      float gmax;
      const int piv = gqt::OctetPivot<G>(v, lane, gs < dim ? min(G, dim - gs) : 0, tau, &gmax);
      wcount += __popc(__ballot_sync(kFullMask, piv >= 0 && (lane & (L - 1)) == 0));
      if ((lane & (L - 1)) == 0 && gs < dim) token_pivots[gs / G] = static_cast<int16_t>(piv);
      mx = fmaxf(mx, gmax);  // elements past dim are 0
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float a = fabsf(v[k]);
      sum[k] = sum[k] + a;
      if (!flags) mx = fmaxf(mx, a);  // drops a NaN, which the sum keeps
      if (entropy) alog[k] = Fma(a, FastLog2(a), alog[k]);
    }
  }
};

// The statistics pass's arguments.
struct StatsArgs {
  int64_t tokens;
  int dim;  // <= 2^30 (the host checks)
  bool entropy, flags;
  float tau;
  TokenInfo* info;
  gqa::TokenArrays tok;
  int16_t* pivots;
  unsigned* hist;
};

// Each warp's sums, maximum and flagged groups, in two sets by the token's parity in its block: a
// token's writes then need no barrier after the last one's reads (one barrier a token).
struct StatsSmem {
  float warp_sum[2][gqt::kWarps], warp_alog[2][gqt::kWarps];
  unsigned warp_max[2][gqt::kWarps];
  int warp_flagged[2][gqt::kWarps];
};

// Token t's allocation key (h: its entropy) counted in the histograms, when the allocation
// selects (they are zero when this kernel starts: the first of the encode, an ordinary launch).
__device__ __forceinline__ void CountToken(const StatsArgs& a, int64_t t, float h) {
  if (a.hist == nullptr) return;
  gqa::CountKey(a.hist, gqa::AllocPrefix(a.entropy, gqa::AllocKey(a.entropy, t, h)));
}

// Token t's lanes combined (ReduceLanesAscending: within the thread, across the warp, across the
// warps) and its figures written. Every thread of the block calls it; `set`: the token's parity.
template <int G>
__device__ __forceinline__ void FinishTokenStats(const StatsLanes<G>& acc, int64_t t, int set, StatsSmem& sm,
                                                 const StatsArgs& a) {
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const float ws = WarpSumAscending(SumOf8(acc.sum));
  const float wa = a.entropy ? WarpSumAscending(SumOf8(acc.alog)) : 0.0f;
  // The maximum by its bits (|x| >= +0 and no NaN: unsigned order is float order).
  const unsigned wmax = __reduce_max_sync(kFullMask, __float_as_uint(acc.mx));
  if (lane == 0) {
    sm.warp_sum[set][warp] = ws;
    sm.warp_alog[set][warp] = wa;
    sm.warp_max[set][warp] = wmax;
    sm.warp_flagged[set][warp] = acc.wcount;
  }
  __syncthreads();
  if (tid != 0) return;
  float sums[gqt::kWarps], alogs[gqt::kWarps];
  unsigned mx_bits = 0;
  int flagged = 0;
  for (int w = 0; w < gqt::kWarps; ++w) {
    sums[w] = sm.warp_sum[set][w];
    alogs[w] = sm.warp_alog[set][w];
    mx_bits = max(mx_bits, sm.warp_max[set][w]);
    flagged += sm.warp_flagged[set][w];
  }
  const float s = SumOf8(sums), al = SumOf8(alogs), mx = __uint_as_float(mx_bits);
  if (!isfinite(s) || mx > 0x1p100f) {  // as group_quant.cc's phase 1
    a.info[t] = TokenInfo{0.0f, 0, 0, 0, 0, 0};
    a.tok.entropy[t] = 0.0f;
    a.tok.flagged[t] = isfinite(s) ? -2 : -1;
    // Counted too, with the key the allocation computes for it (entropy 0): both levels of its
    // selection then count every token, bad or not, as the CPU's nth_element does.
    CountToken(a, t, 0.0f);
    return;
  }
  const float h = a.entropy ? TokenEntropy(s, al) : 0.0f;
  a.info[t] = TokenInfo{h, gqt::TokenExp(mx), 0, 1, flagged, 0};
  a.tok.entropy[t] = h;
  a.tok.flagged[t] = flagged;
  CountToken(a, t, h);
}

// The statistics of tokens blockIdx.x, blockIdx.x + gridDim.x, ..., each row read once from
// global memory: thread tid takes the octets o = tid, tid + 256, ..., which are the CPU's token
// lanes 8 tid .. 8 tid + 7 (kernels.h token_sums), runs their groups' outlier test and adds their
// |x| (and |x| log2 |x|) into its 8 lanes (FinishTokenStats combines them).
// kPrefetch (rows that fit gqt::FitsShortRow): each thread loads its pieces of the block's next
// token before it works on this token's, so the loads are in flight during the work (4 blocks an
// SM: the pieces cost registers); otherwise two octets at a time, both loads in flight before
// either is used. Measured on an H200 (8192 x 4096 fp32): 48.5 us against 53.
// Per token: TokenInfo{entropy, exp, 0, ok, flagged groups, 0} (a bad token: ok 0), its entropy
// and flagged groups (a bad token: entropy 0, flagged -1 NaN/Inf, -2 huge) in `tok`, each group's
// outlier test in `pivots` (when the Hadamard option is on), and its allocation key counted in
// `hist` (when the allocation selects: then `entropy` says whether the key is the entropy or the
// hash).
template <int G, typename T, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, kPrefetch ? 4 : 5)  // 64 or 48 registers
    TokenStatsKernel(const T* __restrict__ x, StatsArgs a) {
  __shared__ StatsSmem sm;
  LetDependentsStart();  // the allocation's first kernel: it waits for this one's end
  const int tid = threadIdx.x, lane = tid % kWarp;
  const int dim = a.dim, noct = (dim + 7) / 8, ng = (dim + G - 1) / G;
  int set = 0;  // the token's parity in this block
  if constexpr (kPrefetch) {
    gqt::ShortRowPieces<T> next{};
    if (blockIdx.x < a.tokens) next = gqt::LoadShortRow(x + static_cast<int64_t>(blockIdx.x) * dim, dim, tid);
    for (int64_t t = blockIdx.x; t < a.tokens; t += gridDim.x, set ^= 1) {
      const gqt::ShortRowPieces<T> cur = next;
      if (t + gridDim.x < a.tokens) next = gqt::LoadShortRow(x + (t + gridDim.x) * dim, dim, tid);
      StatsLanes<G> acc;
      float v[8];
      gqt::ShortRowOctet(cur, 0, v);
      acc.Add(v, tid, dim, lane, a.entropy, a.flags, a.tau, a.pivots + t * ng);
      if (kThreads < noct) {
        gqt::ShortRowOctet(cur, 1, v);
        acc.Add(v, kThreads + tid, dim, lane, a.entropy, a.flags, a.tau, a.pivots + t * ng);
      }
      FinishTokenStats<G>(acc, t, set, sm, a);
    }
  } else {
    for (int64_t t = blockIdx.x; t < a.tokens; t += gridDim.x, set ^= 1) {
      const T* row = x + t * dim;
      const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
      StatsLanes<G> acc;
      for (int ob = 0; ob < noct; ob += 2 * kThreads) {  // the same trip count in every thread
        float v0[8], v1[8];
        LoadOctetGlobal(row, 8 * (ob + tid), dim, aligned, v0);
        LoadOctetGlobal(row, 8 * (ob + kThreads + tid), dim, aligned, v1);
        acc.Add(v0, ob + tid, dim, lane, a.entropy, a.flags, a.tau, a.pivots + t * ng);
        if (ob + kThreads < noct) {
          acc.Add(v1, ob + kThreads + tid, dim, lane, a.entropy, a.flags, a.tau, a.pivots + t * ng);
        }
      }
      FinishTokenStats<G>(acc, t, set, sm, a);
    }
  }
}

}  // namespace longhaul::codec::gpu::gqs

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_STATS_CUH_
