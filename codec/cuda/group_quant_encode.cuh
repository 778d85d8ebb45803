// The grouped encode's kernels on a CUDA device (group_quant.cu launches them; its top comment
// gives the shape of the work): EncodeRow, a token's groups in three phases; EncodeTokens, the
// payload of every token after the statistics and the allocation (tahquant); FusedEncode,
// statistics and payload in one pass (int<k>). Included by group_quant.cu only.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_ENCODE_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_ENCODE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_alloc.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/cuda/group_quant_tokens.cuh"
#include "codec/int_util.h"
#include "codec/minifloat.h"

namespace longhaul::codec::gpu::gqe {

using gqa::Results;
using gqt::kChunk;
using gqt::kThreads;
inline constexpr int kRounds = kChunk / 8 / kThreads;  // rounds of octets in a chunk
static_assert(kRounds <= 2, "TokenSmem::warp_count holds two rounds");
static_assert(gqt::kWarps == 8, "BlockSumOfWarps is SumOf8 over the block's warps");

__device__ __forceinline__ int NumChunks(int64_t dim) { return static_cast<int>((dim + kChunk - 1) / kChunk); }

// The block's total of v (each warp's lanes already combined: WarpSumAscending) in every thread:
// the last three levels of ReduceLanesAscending over the warps. scratch: kWarps floats of shared
// memory; every thread calls it.
__device__ __forceinline__ float BlockSumOfWarps(float v, float* scratch) {
  const int tid = threadIdx.x;
  __syncthreads();  // scratch's earlier readers are done
  if (tid % kWarp == 0) scratch[tid / kWarp] = v;
  __syncthreads();
  float w[gqt::kWarps];
#pragma unroll
  for (int i = 0; i < gqt::kWarps; ++i) w[i] = scratch[i];
  return SumOf8(w);
}

struct EncArgs {
  int64_t tokens, dim;
  int ng;
  float norm;  // HadamardNorm(G), computed on the host
  bool flags;  // the Hadamard option (then `pivots` holds every group's outlier test)
  // FusedEncode: every token at fused_bits, blocks of fused_block bytes; EncodeTokens: info, bits, ends.
  int fused_bits;
  int64_t fused_block;
  const TokenInfo* info;
  const uint8_t* bits;             // each token's bit width (AllocateBits)
  const int16_t* pivots;           // each group's pivot (0..G - 1) or -1 (TokenStatsKernel), with flags
  const unsigned long long* ends;  // ends[t]: the end of token t's block (inclusive scan)
  uint8_t* payload;
  Results* res;
};

// Each round's outlier test (its group's pivot or -1) of a chunk, for the thread's octets.
struct RoundPivots {
  int16_t p[kRounds];
};
// The statistics pass's outlier tests (flags: only TokenStatsKernel's tokens) for the chunk at c0
// of token t.
// kNow: by LoadNowS16.
template <int G, bool kNow = false>
__device__ __forceinline__ RoundPivots LoadRoundPivots(const EncArgs& a, int64_t t, int64_t c0, int len, int tid) {
  RoundPivots r;
  const int16_t* chunk = a.flags ? a.pivots + t * a.ng + c0 / G : nullptr;
#pragma unroll
  for (int k = 0; k < kRounds; ++k) {
    const int gs = (8 * (k * kThreads + tid)) & ~(G - 1);
    r.p[k] = int16_t{-1};
    if (a.flags && gs < len) r.p[k] = kNow ? LoadNowS16(chunk + gs / G) : chunk[gs / G];
  }
  return r;
}

// A one-chunk row's octets and outlier tests, in registers (EncodeRow's kResident form).
struct ResidentRow {
  RoundPivots piv;
  float v[kRounds][8];
};
// The row's octets (the input, which no kernel of the encode writes: loaded before
// WaitForPriorGrids), then, once the earlier kernels are done, its outlier tests.
template <typename T>
__device__ __forceinline__ void LoadResidentOctets(const EncArgs& a, const T* __restrict__ row, ResidentRow* r) {
  const int tid = threadIdx.x, len = static_cast<int>(a.dim);
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
#pragma unroll
  for (int k = 0; k < kRounds; ++k) LoadOctetGlobal<T, true>(row, 8 * (k * kThreads + tid), len, aligned, r->v[k]);
}
template <int G>
__device__ __forceinline__ void LoadResidentPivots(const EncArgs& a, int64_t t, ResidentRow* r) {
  r->piv = LoadRoundPivots<G, true>(a, t, 0, static_cast<int>(a.dim), threadIdx.x);
}

// Token t's groups, its block at blk_off. Per chunk, three phases:
//  A. each lane's octet: its group's outlier test (kept by the statistics pass), the flagged
//     groups' pivots (ordinals by a block-wide count, one barrier for all rounds), the swap and
//     transform, the group's range by its segment, kept in shared memory;
//  B. one thread per group: its parameters (two divisions: once per group, not once per lane),
//     written to the payload and kept in shared memory;
//  C. each lane's octet again: codes against its group's parameters, packed.
// The octets: kResident (a row of one chunk) has them in registers (`resident`, loaded by the
// caller), where they stay from A to C; otherwise each chunk is staged in shared memory (already
// there when `staged`: then chunk 0 is the row's only one), and the transformed octets written back.
template <int G, bool kResident, typename T>
__device__ __forceinline__ void EncodeRow(gqt::TokenSmem& sm, int64_t t, const T* __restrict__ row, const EncArgs& a,
                                          int exp, int bits, int flagged_total, int64_t blk_off, bool staged,
                                          ResidentRow* resident) {
  constexpr int L = G / 8;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  uint8_t* blk = a.payload + blk_off;
  if (tid == 0) {
    blk[0] = static_cast<uint8_t>(bits);
    blk[1] = static_cast<uint8_t>(static_cast<int8_t>(exp));
  }
  const int64_t pivots_at = blk_off + PivotsOffset(a.ng);
  const int64_t codes_at = pivots_at + flagged_total;
  const int maxq = (1 << bits) - 1;
  const float fmaxq = static_cast<float>(maxq);
  const int nch = kResident ? 1 : NumChunks(a.dim);
  const bool leader = (lane & (L - 1)) == 0;
  int ordinal_base = 0;
  for (int c = 0; c < nch; ++c) {
    const int64_t c0 = static_cast<int64_t>(c) * kChunk;
    const int len = static_cast<int>(a.dim - c0 < kChunk ? a.dim - c0 : kChunk);
    const int noct = (len + 7) / 8;
    RoundPivots round_piv;
    if constexpr (kResident) {
      round_piv = resident->piv;
    } else {
      round_piv = LoadRoundPivots<G>(a, t, c0, len, tid);  // before the row: both loads in flight together
      if (!staged) {
        if (c > 0) __syncthreads();  // phase C of the previous chunk is done with the row
        gqt::LoadChunk(sm.row, row + c0, len, tid);
        __syncthreads();
      }
    }
    // A. The flagged groups' ordinals in the token: earlier chunks, rounds, warps, lanes.
    unsigned lead_flags[kRounds];
    if (a.flags) {
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        lead_flags[r] = __ballot_sync(kFullMask, round_piv.p[r] >= 0 && leader);
        if (lane == 0) sm.warp_count[r][warp] = __popc(lead_flags[r]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int ob = r * kThreads;
      if (ob >= noct) break;
      const int o = ob + tid;
      float staged_octet[8];  // (!kResident)
      float (&v)[8] = kResident ? resident->v[r] : staged_octet;
      if constexpr (!kResident) gqt::LoadOctet(sm.row, o, len, v);
      const int e0 = 8 * o;
      const int gs = e0 & ~(G - 1);
      const int cnt = len - e0 < 0 ? 0 : (len - e0 < 8 ? len - e0 : 8);
      int piv = -1;
      if (a.flags) {
        piv = round_piv.p[r];
        int before = ordinal_base, total = 0;
#pragma unroll
        for (int w = 0; w < gqt::kWarps; ++w) {
          const int cw = sm.warp_count[r][w];
          before += w < warp ? cw : 0;
          total += cw;
        }
        ordinal_base += total;
        if (piv >= 0 && leader) {
          a.payload[pivots_at + before + __popc(lead_flags[r] & ((1u << lane) - 1u))] = static_cast<uint8_t>(piv);
        }
        if (__any_sync(kFullMask, piv >= 0)) {
          gqt::SegmentSwap<G>(v, lane, piv);
          gqt::SegmentFwht<G>(v, lane, piv >= 0, a.norm);
          if constexpr (!kResident) {
            if (piv >= 0) gqt::StoreOctet(sm.row, o, v);  // flagged groups are complete
          }
        }
      }
      float lo, hi;
      gqt::SegmentMinMax<G>(v, lane, cnt, 8 * (o - lane) + 8 * kWarp <= len, &lo, &hi);
      if (leader && cnt > 0) sm.group[gs / G] = gqt::GroupRange{lo, hi, piv >= 0 ? 1 : 0};
    }
    __syncthreads();
    // B.
    const int ngc = (len + G - 1) / G;
    for (int gi = tid; gi < ngc; gi += kThreads) {
      const gqt::GroupRange r = sm.group[gi];
      const GroupParams gp = MakeGroupParams(r.lo, r.hi, exp, maxq, r.flagged != 0);
      uint8_t* p3 = blk + ParamsOffset(static_cast<int>(c0 / G) + gi);
      p3[0] = static_cast<uint8_t>(gp.word & 0xFF);
      p3[1] = static_cast<uint8_t>((gp.word >> 8) & 0xFF);
      p3[2] = static_cast<uint8_t>((gp.word >> 16) & 0xFF);
      sm.group[gi].lo = gp.lo_q;
      sm.group[gi].hi = gp.inv_scale;
    }
    __syncthreads();
    // C. (Rolled when staged: two rounds in flight would cost registers and occupancy.)
#pragma unroll(kResident ? kRounds : 1)
    for (int r = 0; r < kRounds; ++r) {
      const int ob = r * kThreads;
      if (ob >= noct) break;
      const int o = ob + tid;
      float staged_octet[8];  // (!kResident)
      float (&v)[8] = kResident ? resident->v[r] : staged_octet;
      if constexpr (!kResident) gqt::LoadOctet(sm.row, o, len, v);
      const int e0 = 8 * o;
      const int cnt = len - e0 < 0 ? 0 : (len - e0 < 8 ? len - e0 : 8);
      uint64_t w = 0;
      int nb = 0;
      const bool whole = 8 * (o - lane) + 8 * kWarp <= len;  // every lane of the warp has 8
      if (whole) {
        const gqt::GroupRange gp = sm.group[e0 / G];
        // TAH-Quant's two widths (and int3, int4) with the width a constant: the block takes one
        // branch.
        w = bits == 4   ? gqt::QuantOctetNarrow<4>(v, gp.lo, gp.hi)
            : bits == 3 ? gqt::QuantOctetNarrow<3>(v, gp.lo, gp.hi)
            : bits <= 4 ? gqt::QuantOctet<false>(v, gp.lo, gp.hi, fmaxq, bits)
                        : gqt::QuantOctet<true>(v, gp.lo, gp.hi, fmaxq, bits);
        nb = bits;
      } else if (cnt > 0) {
        const gqt::GroupRange gp = sm.group[e0 / G];  // lo: the decoded lo; hi: 1 / the decoded scale
        uint32_t w_lo = 0, w_hi = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (j < cnt) {
            const uint32_t qi = gqt::QuantCode((v[j] - gp.lo) * gp.hi, fmaxq);
            if (j < 4) {
              w_lo |= qi << (j * bits);
            } else {
              w_hi |= qi << ((j - 4) * bits);
            }
          }
        }
        w = static_cast<uint64_t>(w_lo) | (static_cast<uint64_t>(w_hi) << (4 * bits));
        nb = (cnt * bits + 7) / 8;
      }
      const int64_t at = codes_at + (c0 / 8 + (o - lane)) * bits;
      gqt::WriteWarpCodes(sm.stage[warp], lane, w, nb, bits, at, a.payload, whole);
    }
  }
}

// The payload of every good token (after TokenStatsKernel and AllocateBits), last token first
// (the statistics pass's last rows are the likeliest still in L2). One token a block: several a
// block measured slower (64 registers and spills against 64 and none, 87 us against 82.5 us on
// an H200 for 8192 x 4096).
// Token t's figures for its encode (the statistics pass's exponent, bad-token mark and flagged
// groups; the allocation's bit width and block offset). Ordinary loads: a one-chunk row's loads
// (LoadResidentOctets, LoadResidentPivots: by LoadNow) come first in program order and stay ahead
// of the early return these decide, wherever the compiler puts these.
struct TokenPlan {
  int exp, ok, flagged, bits;
  int64_t blk_off;
};
__device__ __forceinline__ TokenPlan LoadTokenPlan(const EncArgs& a, int64_t t) {
  const TokenInfo& ti = a.info[t];
  return TokenPlan{ti.exp, ti.ok, ti.flagged, a.bits[t], t == 0 ? 0 : static_cast<int64_t>(a.ends[t - 1])};
}

// Whether a one-chunk token is encoded (p.ok), tested on every figure its encode reads after
// WaitForPriorGrids. ptxas issues a load where its value is first used, so figures used only past
// the early return were loaded after it: a second round trip to memory a block (its wait 14% of
// EncodeTokens' stall samples on an H200). Every other term holds for a good token (a pivot is -1
// or an index, a width 2..8, an exponent clamped, a count and an offset not negative); the terms
// are combined by & so that no branch splits them.
__device__ __forceinline__ bool EncodesToken(const TokenPlan& p, const RoundPivots& piv) {
  bool all = (p.ok != 0) & (p.flagged >= 0) & (p.bits != 0) & (p.exp != INT_MIN) & (p.blk_off >= 0);
#pragma unroll
  for (int k = 0; k < kRounds; ++k) all &= piv.p[k] >= -1;
  return all;
}

// At least kEncodeBlocksPerSm blocks an SM: 48 registers (16 bytes spilled, ptxas sm_90) instead of
// 64, so 5 blocks instead of 4 and a quarter more warps to hide its round trips to memory: 73.3 us
// against 77.4 on an H200 for 8192 x 4096 (Nsight Compute; encode 0.460 of the copy against 0.446,
// four alternating pairs, session 24). 6 blocks: 40 registers and 98 bytes spilled.
inline constexpr int kEncodeBlocksPerSm = 5;

template <int G, typename T>
__global__ void __launch_bounds__(kThreads, kEncodeBlocksPerSm) EncodeTokens(const T* __restrict__ x, EncArgs a) {
  __shared__ gqt::TokenSmem sm;
  const int64_t t = a.tokens - 1 - static_cast<int64_t>(blockIdx.x);
  const T* row = x + t * a.dim;
  if (a.dim <= kChunk) {
    // Every load of a one-chunk token issued before any is used: one round trip to memory, not
    // three (its figures, then its block's place, then its row); the row's even before the
    // allocation has ended (a dependent launch: the first wave of blocks loads while it runs). A
    // bad token's row is read for nothing.
    ResidentRow resident;
    LoadResidentOctets(a, row, &resident);
    WaitForPriorGrids();
    LoadResidentPivots<G>(a, t, &resident);
    const TokenPlan p = LoadTokenPlan(a, t);
    if (!EncodesToken(p, resident.piv)) return;  // the encode fails; the block is not written
    EncodeRow<G, true>(sm, t, row, a, p.exp, p.bits, p.flagged, p.blk_off, false, &resident);
  } else {
    WaitForPriorGrids();
    const TokenPlan p = LoadTokenPlan(a, t);
    if (p.ok == 0) return;
    EncodeRow<G, false>(sm, t, row, a, p.exp, p.bits, p.flagged, p.blk_off, false, nullptr);
  }
}

// int<k>: statistics and payload of token blockIdx.x in one pass. An int<k> token needs only the
// maximum of |x| (its exponent) and the CPU's check (the sum of |x| in token-lane order finite, the
// maximum at most 2^100), so every thread takes its share of the maximum and of the finiteness
// test; the sum in the CPU's order is computed only where it could decide the error's kind (no
// NaN/Inf element, but a maximum large enough for the sum to overflow).
template <int G, typename T>
__global__ void __launch_bounds__(kThreads) FusedEncode(const T* __restrict__ x, EncArgs a) {
  __shared__ gqt::TokenSmem sm;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int64_t t = blockIdx.x;
  const T* row = x + t * a.dim;
  const int nch = NumChunks(a.dim);
  float mx = 0.0f;
  bool finite = true;
  for (int c = 0; c < nch; ++c) {
    const int64_t c0 = static_cast<int64_t>(c) * kChunk;
    const int len = static_cast<int>(a.dim - c0 < kChunk ? a.dim - c0 : kChunk);
    if (c > 0) __syncthreads();
    gqt::LoadChunk(sm.row, row + c0, len, tid);
    __syncthreads();
    // Four elements a load (the row starts 16-byte aligned in shared memory), then the tail.
    const int n4 = len / 4;
    for (int i = tid; i < n4; i += kThreads) {
      const float4 q = reinterpret_cast<const float4*>(sm.row)[i];
      const float e[4] = {fabsf(q.x), fabsf(q.y), fabsf(q.z), fabsf(q.w)};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        finite = finite && isfinite(e[k]);
        mx = e[k] > mx ? e[k] : mx;
      }
    }
    for (int i = 4 * n4 + tid; i < len; i += kThreads) {
      const float v = fabsf(sm.row[i]);
      finite = finite && isfinite(v);
      mx = v > mx ? v : mx;
    }
  }
  mx = WarpMax(mx);
  finite = __all_sync(kFullMask, finite);
  if (lane == 0) {
    sm.warp_max[warp] = mx;
    sm.warp_count[0][warp] = finite ? 1 : 0;
  }
  __syncthreads();  // also: every thread is done reading the staged row
  mx = sm.warp_max[0];
  finite = sm.warp_count[0][0] != 0;
#pragma unroll
  for (int w = 1; w < gqt::kWarps; ++w) {
    mx = sm.warp_max[w] > mx ? sm.warp_max[w] : mx;
    finite = finite && sm.warp_count[0][w] != 0;
  }
  bool sum_finite = finite;
  if (finite && (mx > 0x1p100f || static_cast<double>(mx) * static_cast<double>(a.dim) >= 0x1p127)) {
    // (the same in every thread: the block takes this branch together) The sum in the token
    // lanes' order, as TokenStatsKernel.
    const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
    float lanes[8] = {};
    for (int64_t o = tid; 8 * o < a.dim; o += kThreads) {
      float v[8];
      LoadOctetGlobal(row, 8 * o, a.dim, aligned, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) lanes[k] = lanes[k] + fabsf(v[k]);
    }
    sum_finite = isfinite(BlockSumOfWarps(WarpSumAscending(SumOf8(lanes)), sm.warp_max));
  }
  if (!sum_finite || mx > 0x1p100f) {
    if (tid == 0) atomicMin(&a.res->first_bad, (static_cast<unsigned long long>(t) << 1) | (sum_finite ? 1ull : 0ull));
    return;
  }
  EncodeRow<G, false>(sm, t, row, a, gqt::TokenExp(mx), a.fused_bits, 0, t * a.fused_block, nch == 1, nullptr);
}

}  // namespace longhaul::codec::gpu::gqe

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_ENCODE_CUH_
