// The grouped encoder's per-token pieces (group_quant.cu): a block of 256 threads on a token (the
// statistics pass takes several in turn), the row's octets loaded straight into registers or
// staged in shared memory in chunks of kChunk elements (16-byte loads), then
// worked on in rounds where lane l of warp w handles the octet o = 256 * round + 32 * w + l of the
// chunk (its 8 consecutive elements in registers). A group (G <= 256, a power of two >= 8) is then
// an aligned segment of L = G / 8 lanes of one warp, and its reductions, the Hadamard transform's
// cross-lane stages and the pivot swap are xor shuffles inside the segment: a staged row is read
// from shared memory with no bank conflicts to speak of, and nothing is staged per group.
//
// Bit-exactness with the CPU reference (group_quant.cc, scalar kernels), step by step:
//  - the statistics pass's token sums (group_quant_stats.cuh TokenStatsKernel): thread tid's
//    octets are the CPU's token lanes 8 tid .. 8 tid + 7 (kernels.h token_sums), combined as
//    ReduceLanesAscending; the maximum in any order.
//  - the outlier test: the top two of the group's multiset of |x| by a min/max network (what the
//    scalar Top2Abs's sequential scan computes: values are |x| >= +0, so order cannot change bits),
//    the pivot the first index of the maximum (OctetPivot).
//  - min/max: each lane left to right from its first element, segments combined taking the upper
//    range's value only when strictly smaller (larger): the first occurrence in order, as MinMax's
//    fold; where the warp's octets are complete, fminf/fmaxf (only the sign of a zero could
//    differ, and mf12 has one zero, so no parameter does).
//  - the Walsh-Hadamard stages h = 1, 2, 4 inside a lane, 8 .. G / 2 across lanes (xor h / 8), each
//    pair (a, b) -> (a + b, a - b) as the scalar Fwht, then the multiplication by the norm.
//  - parameters (MakeGroupParams), codes (round half even, clamped) and packing as QuantizeSwapped
//    in group_quant_group.h (host-tested against the CPU reference).
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_TOKENS_CUH_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_TOKENS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/minifloat.h"

namespace longhaul::codec::gpu::gqt {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / kWarp;
inline constexpr int kChunk = 4096;  // elements staged at a time: a multiple of every G and of 32
inline constexpr int kStage = 264;   // a warp's codes of one round: 3 + 32 * 8 bytes, rounded up

// A group's range after phase A of the encode (group_quant.cu EncodeRow), then its decoded lo and
// 1 / decoded scale after phase B.
struct GroupRange {
  float lo, hi;
  int flagged;
};

struct alignas(16) TokenSmem {
  float row[kChunk];
  GroupRange group[kChunk / 8];  // the chunk's groups (G >= 8)
  alignas(4) uint8_t stage[kWarps][kStage];
  int warp_count[2][kWarps];
  float warp_max[kWarps];
};

// The token exponent from the maximum of |x| (as group_quant.cc's phase 1).
__device__ __forceinline__ int TokenExp(float mx) {
  int e2 = 0;
  if (mx > 0.0f) frexpf(mx, &e2);
  return min(max(e2 + 4, kMinTokenExp), kMaxTokenExp);
}

// A short row: at most kThreads * kRowOctets octets (thread tid's are tid and tid + kThreads), and
// every row of the tensor starting on 16 bytes, so that a thread's octets are whole 16-byte pieces
// (2 an octet for fp32, 1 for 16-bit types). The statistics pass loads a block's next short row
// into registers while it works on this one's (TokenStatsKernel's kPrefetch).
inline constexpr int kRowOctets = 2;
inline constexpr int kMaxShortRow = 8 * kRowOctets * kThreads;  // elements

template <typename T>
__host__ __device__ inline bool FitsShortRow(const T* x, int64_t dim) {
  return dim > 0 && dim <= kMaxShortRow && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
         (dim * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// Thread tid's pieces of a short row.
template <typename T>
struct ShortRowPieces {
  static constexpr int kPieces = static_cast<int>(sizeof(T)) / 2;  // an octet's
  uint4 p[kRowOctets * kPieces];
};

// Thread tid's pieces of `row` (dim elements, FitsShortRow), issued by LoadNow16 (where they
// stand: the caller wants them in flight while it works); pieces past the row are zeros (then the
// whole piece is: dim is a multiple of a piece's elements).
template <typename T>
__device__ __forceinline__ ShortRowPieces<T> LoadShortRow(const T* row, int dim, int tid) {
  constexpr int kPieces = ShortRowPieces<T>::kPieces, kPer = 16 / static_cast<int>(sizeof(T));
  ShortRowPieces<T> r;
#pragma unroll
  for (int k = 0; k < kRowOctets; ++k) {
#pragma unroll
    for (int h = 0; h < kPieces; ++h) {
      const int e = 8 * (k * kThreads + tid) + h * kPer;
      r.p[k * kPieces + h] = e < dim ? LoadNow16(row + e) : uint4{};
    }
  }
  return r;
}

// The thread's k-th octet of a short row, as floats.
template <typename T>
__device__ __forceinline__ void ShortRowOctet(const ShortRowPieces<T>& r, int k, float (&v)[8]) {
  constexpr int kPieces = ShortRowPieces<T>::kPieces;
  if constexpr (kPieces == 2) {
    OctetFromPieces<T>(r.p[2 * k], r.p[2 * k + 1], v);
  } else {
    OctetFromPieces<T>(r.p[k], uint4{}, v);
  }
}

// dst[0, len) = src[0, len) as floats, by the whole block (16-byte loads when src is aligned, four
// of them issued before any store).
template <typename T>
__device__ __forceinline__ void LoadChunk(float* __restrict__ dst, const T* __restrict__ src, int len, int tid) {
  if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
    constexpr int kPer = 16 / sizeof(T);  // elements per 16 bytes
    const int nv = len / kPer;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int b = 0; b < nv; b += 4 * kThreads) {
      uint4 r[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = b + u * kThreads + tid;
        r[u] = i < nv ? s[i] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = b + u * kThreads + tid;
        if (i >= nv) continue;
        if constexpr (std::is_same_v<T, float>) {
          reinterpret_cast<uint4*>(dst)[i] = r[u];
        } else {
          const uint32_t wd[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
          float f[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) f[k] = Widen<T>(static_cast<uint16_t>(wd[k / 2] >> (16 * (k % 2))));
          reinterpret_cast<float4*>(dst)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
          reinterpret_cast<float4*>(dst)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
        }
      }
    }
    for (int i = nv * kPer + tid; i < len; i += kThreads) dst[i] = LoadF(src, i);
    return;
  }
  for (int i = tid; i < len; i += kThreads) dst[i] = LoadF(src, i);
}

// The lane's octet o of the staged chunk (elements past len: 0).
__device__ __forceinline__ void LoadOctet(const float* row, int o, int len, float (&v)[8]) {
  const int e0 = 8 * o;
  if (e0 + 8 <= len) {
    const float4 a = reinterpret_cast<const float4*>(row + e0)[0];
    const float4 b = reinterpret_cast<const float4*>(row + e0)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = e0 + j < len ? row[e0 + j] : 0.0f;
  }
}

// The code of y = (v - lo) * inv_scale: round half to even, clamped to [0, maxq], NaN -> 0, as the
// CPU's Quantize (which rounds, then clamps: the same codes, since rounding is monotonic and 0 and
// maxq are integers). The rounding is an add of 1.5 * 2^23, exact for the clamped values and
// rounded to nearest even by the add itself, the integer then read from the mantissa: two
// full-rate instructions instead of a round and a conversion, which run at a quarter of the rate.
// The clamp is fmaxf/fminf (one instruction each): NaN -> 0 as the CPU's compare-and-select, and
// the sign a zero may get makes no code differ.
// The rounding's constant (1.5 * 2^23) and its float bits: a code q's sum has the bits kCodeZero + q.
inline constexpr float kCodeRound = 12582912.0f;
inline constexpr uint32_t kCodeZero = 0x4B400000u;
// The float bits of y clamped to [0, fmaxq] plus kCodeRound: kCodeZero + its code.
__device__ __forceinline__ uint32_t CodeBits(float y, float fmaxq) {
  return __float_as_uint(__fadd_rn(fminf(fmaxf(y, 0.0f), fmaxq), kCodeRound));
}
__device__ __forceinline__ uint32_t QuantCode(float y, float fmaxq) { return CodeBits(y, fmaxq) - kCodeZero; }

// The codes of a complete octet against its group's decoded lo and 1 / scale, packed (code j at bit
// j * bits): QuantCode's, in two 32-bit halves of four codes; kWide when bits > 4 (the halves then
// joined in 64 bits).
template <bool kWide>
__device__ __forceinline__ uint64_t QuantOctet(const float (&v)[8], float lo, float inv, float fmaxq, int bits) {
  uint32_t w_lo = 0, w_hi = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w_lo |= QuantCode((v[j] - lo) * inv, fmaxq) << (j * bits);
    w_hi |= QuantCode((v[j + 4] - lo) * inv, fmaxq) << (j * bits);
  }
  if constexpr (kWide) return static_cast<uint64_t>(w_lo) | (static_cast<uint64_t>(w_hi) << (4 * bits));
  return w_lo | (w_hi << (4 * bits));
}

// QuantOctet for a width known when compiling, at most 4 bits (all eight codes in one word): code j
// is u_j - kCodeZero, u_j its CodeBits, so the packed word, the sum of the codes each shifted into
// place (their fields are disjoint), is the sum of the u_j shifted alike less kCodeZero's share of
// it, modulo 2^32 both: one multiply-add by a power of two (IMAD) a code
// instead of a subtraction, a shift and an OR. The same codes as QuantOctet<false>(..., kBits).
template <int kBits>
__device__ __forceinline__ uint32_t QuantOctetNarrow(const float (&v)[8], float lo, float inv) {
  static_assert(kBits >= 1 && kBits <= 4, "eight codes in one 32-bit word");
  constexpr float kMaxq = static_cast<float>((1 << kBits) - 1);
  uint32_t zero_share = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) zero_share += kCodeZero << (j * kBits);
  uint32_t w = 0u - zero_share;
#pragma unroll
  for (int j = 0; j < 8; ++j) w += CodeBits((v[j] - lo) * inv, kMaxq) << (j * kBits);
  return w;
}

// A code (below 2^23) as a float, exactly as static_cast<float>, without the conversion instruction.
__device__ __forceinline__ float CodeToFloat(uint32_t q) {
  return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f);
}

// The lane's octet o of the staged chunk back (a complete octet).
__device__ __forceinline__ void StoreOctet(float* row, int o, const float (&v)[8]) {
  reinterpret_cast<float4*>(row + 8 * o)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(row + 8 * o)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// The outlier test of the lane's group (n: its elements, G when complete): the pivot, or -1. Every
// lane of the warp calls it; every lane of a segment gets the same answer.
// The two largest |v| of the group as the scalar Top2Abs's scan gives them (a multiset: m2 == m1
// when the maximum repeats) by a min/max network: per element m2 = max(m2, min(m1, a)), m1 =
// max(m1, a); segments combine m1 = max of both, m2 = max(the smaller m1, both m2). The values are
// |x| >= +0 (a NaN makes the token fail before its pivots are read), so fminf/fmaxf give the
// scan's bits. Then the test as the CPU's; the pivot, the first index of the maximum (the scan's
// last strict rise), only in warps where a group is flagged.
// *group_max: the group's largest |v| (every lane of the segment).
template <int G>
__device__ __forceinline__ int OctetPivot(const float (&v)[8], int lane, int n, float tau, float* group_max) {
  constexpr int L = G / 8;
  float m1 = 0.0f, m2 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float a = fabsf(v[j]);
    m2 = fmaxf(m2, fminf(m1, a));
    m1 = fmaxf(m1, a);
  }
#pragma unroll
  for (int h = 1; h < L; h *= 2) {
    const float o1 = __shfl_xor_sync(kFullMask, m1, h), o2 = __shfl_xor_sync(kFullMask, m2, h);
    m2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
    m1 = fmaxf(m1, o1);
  }
  *group_max = m1;
  const bool flagged = n == G && IsOutlierGroup(m1, m2, tau);
  if (!__any_sync(kFullMask, flagged)) return -1;
  int piv = G;  // the lane's first index of the maximum in the group, G when it has none
#pragma unroll
  for (int j = 7; j >= 0; --j) piv = fabsf(v[j]) == m1 ? 8 * (lane & (L - 1)) + j : piv;
#pragma unroll
  for (int h = 1; h < L; h *= 2) piv = min(piv, __shfl_xor_sync(kFullMask, piv, h));
  return flagged ? piv : -1;
}

// Swaps elements 0 and piv of each flagged segment (piv >= 0, the same in every lane of a segment):
// the encoder's pivot swap before the transform, and the decoder's swap back after it. Every lane of
// the warp calls it.
template <int G>
__device__ __forceinline__ void SegmentSwap(float (&v)[8], int lane, int piv) {
  constexpr int L = G / 8;
  const bool flagged = piv >= 0;
  const int p = flagged ? piv : 0;
  const int leader = lane & ~(L - 1);
  const int src = leader + (p >> 3);
  // v[p & 7] by a tree of selects on p's bits: a loop of compares becomes an indexed load, which
  // puts the whole octet in local memory.
  const int q = p & 7;
  const float s01 = (q & 1) ? v[1] : v[0], s23 = (q & 1) ? v[3] : v[2];
  const float s45 = (q & 1) ? v[5] : v[4], s67 = (q & 1) ? v[7] : v[6];
  const float s03 = (q & 2) ? s23 : s01, s47 = (q & 2) ? s67 : s45;
  const float mine_p = (q & 4) ? s47 : s03;
  const float val0 = __shfl_sync(kFullMask, v[0], leader);
  const float valp = __shfl_sync(kFullMask, mine_p, src);  // src has this segment's p
  if (flagged) {
    if (lane == leader) v[0] = valp;
    if (lane == src) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = (p & 7) == j ? val0 : v[j];
    }
  }
}

// The orthonormal Walsh-Hadamard transform of the flagged segments (complete groups only), as the
// scalar Fwht: stages h = 1, 2, 4 inside the lane, then 8 .. G / 2 across lanes, then the norm.
// The transform is its own inverse, so the decoder runs the same steps. Every lane of the warp calls it.
template <int G>
__device__ __forceinline__ void SegmentFwht(float (&v)[8], int lane, bool flagged, float norm) {
  constexpr int L = G / 8;
  if (flagged) {
#pragma unroll
    for (int h = 1; h < 8; h *= 2) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if ((j & h) == 0) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
  }
#pragma unroll
  for (int h = 1; h < L; h *= 2) {  // element stage 8 * h: partner lane xor h
    const bool upper = (lane & h) != 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float o = __shfl_xor_sync(kFullMask, v[j], h);
      const float nv = upper ? o - v[j] : v[j] + o;
      v[j] = flagged ? nv : v[j];
    }
  }
  if (flagged) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * norm;
  }
}

// min and max of the segment's first `cnt` elements of each lane (cnt: 0..8, valid elements a
// prefix of the group), as MinMax's left-to-right fold. all_valid: every lane of the warp has 8
// (the same in every lane; the combination then needs no validity). Every lane of the warp calls it.
template <int G>
__device__ __forceinline__ void SegmentMinMax(const float (&v)[8], int lane, int cnt, bool all_valid, float* lo_out,
                                              float* hi_out) {
  constexpr int L = G / 8;
  float lo = v[0], hi = v[0];
  if (all_valid) {
    // The values are finite (the encoder refuses other input), and which of two equal zeros the
    // fold keeps changes no parameter (mf12 has one zero), so fminf/fmaxf in any order will do.
#pragma unroll
    for (int j = 1; j < 8; ++j) {
      lo = fminf(lo, v[j]);
      hi = fmaxf(hi, v[j]);
    }
#pragma unroll
    for (int h = 1; h < L; h *= 2) {
      lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, h));
      hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, h));
    }
    *lo_out = lo;
    *hi_out = hi;
    return;
  }
#pragma unroll
  for (int j = 1; j < 8; ++j) {
    if (j < cnt) {
      lo = v[j] < lo ? v[j] : lo;
      hi = v[j] > hi ? v[j] : hi;
    }
  }
  bool valid = cnt > 0;
#pragma unroll
  for (int h = 1; h < L; h *= 2) {
    const float olo = __shfl_xor_sync(kFullMask, lo, h), ohi = __shfl_xor_sync(kFullMask, hi, h);
    const bool ovalid = __shfl_xor_sync(kFullMask, valid ? 1 : 0, h) != 0;
    const bool mine_lower = (lane & h) == 0;
    const float llo = mine_lower ? lo : olo, lhi = mine_lower ? hi : ohi;
    const float ulo = mine_lower ? olo : lo, uhi = mine_lower ? ohi : hi;
    const bool lvalid = mine_lower ? valid : ovalid, uvalid = mine_lower ? ovalid : valid;
    if (lvalid && uvalid) {
      lo = ulo < llo ? ulo : llo;
      hi = uhi > lhi ? uhi : lhi;
    } else {
      lo = uvalid ? ulo : llo;
      hi = uvalid ? uhi : lhi;
    }
    valid = lvalid || uvalid;
  }
  *lo_out = lo;
  *hi_out = hi;
}

// The warp's codes of one round out: lane l's nb bytes (the low bytes of w) go to payload[at + l *
// bits ..), at = the warp's first byte. Staged in shared memory so the warp stores aligned words
// (bytes only at the two ragged ends). Every lane of the warp calls it.
// whole: every lane has `bits` bytes (the same in every lane). With 4 or 8 bits a lane's bytes then
// start on a word boundary of the warp's run, shifted by s = at % 4, so each lane forms its aligned
// words from its own bytes and the s last of the previous lane's, without the stage; byte stores
// only for the part of the first word before the run and the s bytes after the last full word.
__device__ __forceinline__ void WriteWarpCodes(uint8_t* stage, int lane, uint64_t w, int nb, int bits, int64_t at,
                                               uint8_t* __restrict__ payload, bool whole) {
  const int s = static_cast<int>(at & 3);
  if (whole && (bits == 4 || bits == 8)) {
    uint8_t* base = payload + (at - s);  // 4-byte aligned: the payload is
    const int lane_bits = 8 * bits;
    const uint64_t prev = __shfl_up_sync(kFullMask, w, 1);
    uint64_t val = s == 0 ? w : (w << (8 * s)) | (prev >> (lane_bits - 8 * s));
    if (bits == 4) val &= 0xFFFFFFFFull;
    uint8_t* dst = base + bits * lane;
    for (int k = 0; k < bits / 4; ++k) {
      const uint32_t word = static_cast<uint32_t>(val >> (32 * k));
      if (lane == 0 && k == 0 && s != 0) {
        for (int b = s; b < 4; ++b) dst[b] = static_cast<uint8_t>(word >> (8 * b));
      } else {
        reinterpret_cast<uint32_t*>(dst)[k] = word;
      }
    }
    if (lane == kWarp - 1 && s != 0) {
      const uint64_t tail = w >> (lane_bits - 8 * s);
      for (int b = 0; b < s; ++b) base[kWarp * bits + b] = static_cast<uint8_t>(tail >> (8 * b));
    }
    return;
  }
  const int first = s + lane * bits;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k < nb) stage[first + k] = static_cast<uint8_t>(w >> (8 * k));
  }
  int end = nb > 0 ? first + nb : 0;
#pragma unroll
  for (int h = kWarp / 2; h >= 1; h /= 2) end = max(end, __shfl_xor_sync(kFullMask, end, h));
  __syncwarp();
  uint8_t* base = payload + (at - s);  // 4-byte aligned: the payload is
  for (int wi = lane; 4 * wi < end; wi += kWarp) {
    const int b0 = 4 * wi;
    if (b0 >= s && b0 + 4 <= end) {
      reinterpret_cast<uint32_t*>(base)[wi] = reinterpret_cast<const uint32_t*>(stage)[wi];
    } else {
      for (int b = b0 < s ? s : b0; b < b0 + 4 && b < end; ++b) base[b] = stage[b];
    }
  }
  __syncwarp();  // the stage is reused by the next round
}

}  // namespace longhaul::codec::gpu::gqt

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_TOKENS_CUH_
