// The per-group arithmetic of the GPU grouped-quantisation encoder, in plain C++ marked LONGHAUL_HD
// so the host compiles the same source. The kernels (group_quant.cu, group_quant_tokens.cuh) now
// spread a group over lanes and share from here MakeGroupParams' use, RoundHalfEven, AbsF, the
// token block's offsets and TokenInfo; the one-thread-per-group phases below are the reference
// formulation of the same steps: tests/codec/group_quant_group_test.cc runs them on the host,
// thread after thread and phase after phase as barriers would order them, and compares the payload
// byte for byte with the CPU reference (group_quant.cc).
//
// Per group the encoder does what group_quant.cc does per group: the outlier test (Top2Abs,
// IsOutlierGroup(a1, a2, tau), pivot = first index of the largest |v|), the pivot swap and the
// Walsh-Hadamard transform in the scalar kernel's butterfly order, min/max, QuantizeGroup's mf12
// parameters, codes round-half-even and clamped, and the codes bit-packed as kernels' Pack packs
// them (a group starts at a multiple of 8 elements, so its runs of 8 are the tensor row's runs).
//
// Block geometry: kGroups consecutive groups per block (group k = t * ng + gi), one per thread.
// Consecutive groups are adjacent in memory (rows are contiguous), so the block stages its groups
// with coalesced loads: step r of thread i loads element q % G of slot q / G, q = r * kGroups + i.
// A slot holds G + 1 floats: thread i reads its group at word i * (G + 1) + j, so the 32 lanes of a
// warp hit 32 different banks for every G. Codes go through shared memory too (G + 4 bytes a slot,
// an odd number of words) and leave with coalesced byte stores, in the same slot/offset order.
#ifndef LONGHAUL_CODEC_CUDA_GROUP_QUANT_GROUP_H_
#define LONGHAUL_CODEC_CUDA_GROUP_QUANT_GROUP_H_

#include <cmath>
#include <cstdint>

#include "codec/cpu/kernels_common.h"
#include "codec/hd.h"
#include "codec/int_util.h"
#include "codec/minifloat.h"

// Loop unrolling on the device only (the host compiler would warn about the pragma). The count may
// depend on a template parameter: group arrays of up to 64 floats stay in registers only when every
// index is a constant, so their loops unroll fully.
#ifdef __CUDA_ARCH__
#define LONGHAUL_GQ_PRAGMA(x) _Pragma(#x)
#else
#define LONGHAUL_GQ_PRAGMA(x)
#endif
#ifdef __CUDACC__
#define LONGHAUL_GQ_INLINE __forceinline__
#else
#define LONGHAUL_GQ_INLINE inline
#endif

namespace longhaul::codec::gpu {

// Groups of up to this size are copied into a register array; larger ones are encoded in place in
// their shared-memory slot (a 128- or 256-float array would live in local memory).
inline constexpr int kMaxRegisterGroup = 64;

// round half to even: rintf on the device, nearbyint (the default rounding mode) as the CPU's
// Quantize on the host.
LONGHAUL_HD inline float RoundHalfEven(float x) {
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

LONGHAUL_HD inline float AbsF(float x) { return BitsFloat(FloatBits(x) & 0x7FFFFFFFu); }  // == fabs

LONGHAUL_HD constexpr int Log2Of(int g) { return g <= 1 ? 0 : 1 + Log2Of(g / 2); }

template <int G>
struct GroupGeometry {
  static_assert(G >= 8 && G <= 256 && (G & (G - 1)) == 0, "group size");
  static constexpr int kLog = Log2Of(G);
  // Groups (threads) per block: about 32 KiB of fp32 staged, within 48 KiB of shared memory.
  static constexpr int kGroups = G <= 32 ? 256 : 8192 / G;
  static constexpr int kVStride = G + 1;   // floats per slot
  static constexpr int kCStride = G + 4;   // code bytes per slot (bits <= 8)
  static constexpr int kLoadBatch = G < 16 ? G : 16;  // loads in flight per thread
  // Unroll counts of the per-group loops: all of it for a register array, a little in place.
  static constexpr bool kRegisters = G <= kMaxRegisterGroup;
  static constexpr int kUnroll = kRegisters ? G : 8;          // a loop over the group
  static constexpr int kHalfUnroll = kRegisters ? G / 2 : 8;  // over a Hadamard stage's pairs
  static constexpr int kRunUnroll = kRegisters ? G / 8 : 2;   // over the runs of 8 codes
};

// The outlier test of one group: -1, or the pivot (the first index of the largest |v_i|) when the
// group is complete (n == G) and IsOutlierGroup over Top2Abs's two largest |v_i|.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE int OutlierPivot(const float* v, int n, float tau) {
  if (n != G) return -1;
  float m1 = 0.0f, m2 = 0.0f;
  int piv = 0;  // the last strict rise of m1 is the first index of the maximum
  LONGHAUL_GQ_PRAGMA(unroll (GroupGeometry<G>::kUnroll))
  for (int i = 0; i < G; ++i) {
    const float a = AbsF(v[i]);
    if (a > m1) {
      m2 = m1;
      m1 = a;
      piv = i;
    } else if (a > m2) {
      m2 = a;
    }
  }
  return IsOutlierGroup(m1, m2, tau) ? piv : -1;
}

// v[0, n): the group after the pivot swap (n == G when flagged). Transforms it when flagged, then
// writes the 24-bit parameter word to params3[0..2] and the packed codes to codes[0,
// ceil(n * bits / 8)). v may be modified.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE void QuantizeSwapped(float* v, int n, int exp, int bits, bool flagged, float norm,
                                                    uint8_t* params3, uint8_t* codes) {
  using Geo = GroupGeometry<G>;
  if (flagged) {
    // Stage s pairs (i, i + h), h = 2^s, for the i whose bit s is clear: the scalar Fwht's pairs
    // in its order (the pairs of a stage are disjoint, so any order gives the same bits).
    LONGHAUL_GQ_PRAGMA(unroll)
    for (int s = 0; s < Geo::kLog; ++s) {
      const int h = 1 << s;
      LONGHAUL_GQ_PRAGMA(unroll (Geo::kHalfUnroll))
      for (int q = 0; q < G / 2; ++q) {
        const int i = ((q >> s) << (s + 1)) | (q & (h - 1));
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
    LONGHAUL_GQ_PRAGMA(unroll (Geo::kUnroll))
    for (int i = 0; i < G; ++i) v[i] *= norm;
  }
  // kernels' MinMax: first element, then left to right.
  float lo = v[0], hi = v[0];
  LONGHAUL_GQ_PRAGMA(unroll (Geo::kUnroll))
  for (int i = 1; i < G; ++i) {
    if (i < n) {
      lo = v[i] < lo ? v[i] : lo;
      hi = v[i] > hi ? v[i] : hi;
    }
  }
  // QuantizeGroup: lo rounded down, the scale up, the codes against the decoded values.
  const int maxq = (1 << bits) - 1;
  const GroupParams gp = MakeGroupParams(lo, hi, exp, maxq, flagged);
  const float lo_q = gp.lo_q, inv = gp.inv_scale;
  const float fmaxq = static_cast<float>(maxq);
  const uint32_t word = gp.word;
  params3[0] = static_cast<uint8_t>(word & 0xFF);
  params3[1] = static_cast<uint8_t>((word >> 8) & 0xFF);
  params3[2] = static_cast<uint8_t>((word >> 16) & 0xFF);
  // kernels' Quantize and Pack, fused: each run of 8 codes becomes `bits` bytes (little-endian),
  // a final partial run ceil(len * bits / 8).
  LONGHAUL_GQ_PRAGMA(unroll (Geo::kRunUnroll))
  for (int r = 0; r < G / 8; ++r) {
    const int base = 8 * r;
    if (base < n) {
      uint64_t w = 0;
      LONGHAUL_GQ_PRAGMA(unroll)
      for (int j = 0; j < 8; ++j) {
        if (base + j < n) {
          float c = RoundHalfEven((v[base + j] - lo_q) * inv);
          c = c >= 0.0f ? c : 0.0f;  // NaN (0 * inf when the scale underflows) -> 0, as on the CPU
          c = c > fmaxq ? fmaxq : c;
          w |= static_cast<uint64_t>(static_cast<int>(c)) << (j * bits);
        }
      }
      const int len = n - base < 8 ? n - base : 8;
      const int nb = (len * bits + 7) / 8;
      uint8_t* out = codes + r * bits;
      LONGHAUL_GQ_PRAGMA(unroll)
      for (int b = 0; b < 8; ++b) {
        if (b < nb) out[b] = static_cast<uint8_t>(w >> (8 * b));
      }
    }
  }
}

// Encodes the group v_in[0, n) (1 <= n <= G; pivot -1, or the outlier test's pivot when the group
// is flagged) through a copy in a local array (registers for G <= 64), swapping while copying so
// that no index into the array depends on data.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE void EncodeGroup(const float* v_in, int n, int exp, int bits, int pivot, float norm,
                                                uint8_t* params3, uint8_t* codes) {
  float v[G];
  LONGHAUL_GQ_PRAGMA(unroll)
  for (int j = 0; j < G; ++j) {
    const int src = pivot < 0 ? j : (j == 0 ? pivot : (j == pivot ? 0 : j));
    v[j] = j < n ? v_in[src] : 0.0f;
  }
  QuantizeSwapped<G>(v, n, exp, bits, pivot >= 0, norm, params3, codes);
}

// The same, in place (v is modified): for groups too large for registers.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE void EncodeGroupInPlace(float* v, int n, int exp, int bits, int pivot, float norm,
                                                       uint8_t* params3, uint8_t* codes) {
  if (pivot >= 0) {
    const float tmp = v[0];
    v[0] = v[pivot];
    v[pivot] = tmp;
  }
  QuantizeSwapped<G>(v, n, exp, bits, pivot >= 0, norm, params3, codes);
}

// --- the token block (group_quant.h's layout) ---

struct TokenInfo {
  float key;              // entropy (+0.0, so that -0 and +0 sort as equal)
  int32_t exp;            // token exponent E
  int32_t bits;           // bit width (the host reference's; the kernels keep theirs in gqa::TokenArrays)
  int32_t ok;             // 0: NaN/Inf/huge (the encode fails; the block is not written)
  int32_t flagged;        // groups the outlier test flags (TokenStatsKernel; TokenBlockBytes in the reference)
  int32_t first_ordinal;  // flagged groups of all earlier tokens (TokenBlockBytes; the kernels count in place)
};

LONGHAUL_HD inline int64_t ParamsOffset(int gi) { return 2 + 3 * static_cast<int64_t>(gi); }
LONGHAUL_HD inline int64_t PivotsOffset(int ng) { return 2 + 3 * static_cast<int64_t>(ng); }
// Group gi's codes: gi * g is a multiple of 8, so they start on a byte.
LONGHAUL_HD inline int64_t CodesOffset(int ng, int flagged, int gi, int g, int bits) {
  return PivotsOffset(ng) + flagged + static_cast<int64_t>(gi) * g * bits / 8;
}

// Token t's flagged count and first ordinal from the flags and their exclusive scan (both null
// without the Hadamard option), stored in *ti; returns the token block's size in bytes.
LONGHAUL_HD inline uint64_t TokenBlockBytes(TokenInfo* ti, int64_t t, int64_t dim, int ng, const int32_t* flag,
                                            const int32_t* ordinal) {
  int32_t flagged = 0, first = 0;
  if (flag != nullptr) {
    const int64_t k0 = t * ng, k1 = k0 + ng - 1;
    first = ordinal[k0];
    flagged = ordinal[k1] + flag[k1] - first;
  }
  ti->flagged = flagged;
  ti->first_ordinal = first;
  return static_cast<uint64_t>(PivotsOffset(ng) + flagged + (dim * ti->bits + 7) / 8);
}

// Group k (the callers keep tokens * ng <= INT_MAX, so 32-bit division suffices).
struct GroupSpan {
  int64_t t;      // token
  int gi;         // group in the token
  int n;          // elements (G, or fewer for the row's last group)
  int64_t start;  // its first element in x
};
LONGHAUL_HD inline GroupSpan LocateGroup(int64_t k, int ng, int64_t dim, int g) {
  const uint32_t kk = static_cast<uint32_t>(k), t = kk / static_cast<uint32_t>(ng);
  GroupSpan s;
  s.t = t;
  s.gi = static_cast<int>(kk - t * static_cast<uint32_t>(ng));
  const int64_t col = static_cast<int64_t>(s.gi) * g;
  s.n = static_cast<int>(dim - col < g ? dim - col : g);
  s.start = s.t * dim + col;
  return s;
}

// --- the block phases ---

// Shared memory of both kernels. off/n: until the barrier after staging, where the slot's group
// lies in x and its elements (0: none); in the encoder after it, where the slot's codes go in the
// payload and their bytes (0: none).
template <int G>
struct StageSmem {
  float v[GroupGeometry<G>::kGroups * GroupGeometry<G>::kVStride];
  int64_t off[GroupGeometry<G>::kGroups];
  int32_t n[GroupGeometry<G>::kGroups];
};
template <int G>
struct EncodeSmem {
  StageSmem<G> stage;
  uint8_t codes[GroupGeometry<G>::kGroups * GroupGeometry<G>::kCStride];
};

// Phase 1 of the flag kernel (thread tid of block `block`): its group, or k >= groups for none.
template <int G>
LONGHAUL_HD inline int64_t FlagSetup(StageSmem<G>& sm, int64_t block, int tid, int64_t groups, int ng,
                                     int64_t dim) {
  const int64_t k = block * GroupGeometry<G>::kGroups + tid;
  int64_t start = 0;
  int n = 0;
  if (k < groups) {
    const GroupSpan s = LocateGroup(k, ng, dim, G);
    start = s.start;
    n = s.n;
  }
  sm.off[tid] = start;
  sm.n[tid] = n;
  return k;
}

// Phase 2 of both kernels: stage the block's groups (after a barrier that follows phase 1).
// load(i) returns element i of x as a float.
template <int G, typename Load>
LONGHAUL_HD LONGHAUL_GQ_INLINE void StageGroups(StageSmem<G>& sm, int tid, const Load& load) {
  using Geo = GroupGeometry<G>;
  constexpr int kB = Geo::kLoadBatch;
  for (int row0 = 0; row0 < G; row0 += kB) {
    float r[kB];
    LONGHAUL_GQ_PRAGMA(unroll)
    for (int u = 0; u < kB; ++u) {  // all loads first, so kB are in flight
      const int q = (row0 + u) * Geo::kGroups + tid;
      const int slot = q >> Geo::kLog, j = q & (G - 1);
      const bool in = j < sm.n[slot];
      // Unconditional (off is an element of x even without a group), so nothing keeps the
      // compiler from issuing the batch's loads back to back; out-of-group lanes read a line their
      // neighbours read anyway.
      const float e = load(sm.off[slot] + (in ? j : 0));
      r[u] = in ? e : 0.0f;
    }
    LONGHAUL_GQ_PRAGMA(unroll)
    for (int u = 0; u < kB; ++u) {
      const int q = (row0 + u) * Geo::kGroups + tid;
      sm.v[(q >> Geo::kLog) * Geo::kVStride + (q & (G - 1))] = r[u];
    }
  }
}

// Phase 3 of the flag kernel (after a barrier): flag[k] (0/1) and pivot[k] of the thread's group.
template <int G>
LONGHAUL_HD inline void FlagSlot(const StageSmem<G>& sm, int tid, int64_t k, int64_t groups, float tau,
                                 int32_t* flag, uint8_t* pivot) {
  if (k >= groups) return;
  const int piv = OutlierPivot<G>(sm.v + tid * GroupGeometry<G>::kVStride, sm.n[tid], tau);
  flag[k] = piv >= 0 ? 1 : 0;
  pivot[k] = static_cast<uint8_t>(piv >= 0 ? piv : 0);
}

struct EncodeArgs {
  int64_t tokens, dim;
  int ng;
  float norm;                        // HadamardNorm(G), computed on the host
  const TokenInfo* info;             // bits, exp, ok, flagged, first_ordinal
  const unsigned long long* ends;    // ends[t]: the end of token t's block (inclusive scan)
  const int32_t* flag;               // per group; null without the Hadamard option
  const int32_t* ordinal;            // exclusive scan of flag
  const uint8_t* pivot;              // per group, where flagged
  uint8_t* payload;
};

struct SlotState {
  int64_t k;  // the thread's group; >= tokens * ng: none
  GroupSpan span;
  bool encode;  // a group of a good token
};

// Phase 1 of the encoder: the thread's group; groups of bad tokens are neither read nor written.
template <int G>
LONGHAUL_HD inline SlotState EncodeSetup(const EncodeArgs& a, StageSmem<G>& sm, int64_t block, int tid) {
  SlotState st;
  st.k = block * GroupGeometry<G>::kGroups + tid;
  st.span = GroupSpan{0, 0, 0, 0};
  st.encode = false;
  if (st.k < a.tokens * a.ng) {
    st.span = LocateGroup(st.k, a.ng, a.dim, G);
    st.encode = a.info[st.span.t].ok != 0;
  }
  sm.off[tid] = st.encode ? st.span.start : 0;
  sm.n[tid] = st.encode ? st.span.n : 0;
  return st;
}

// Phase 3 of the encoder (after the barrier that ends staging): the header (group 0's thread), the
// group's params and pivot into the payload, its codes into the slot's code area, and off/n of the
// slot to where those codes go.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE void EncodeSlot(const EncodeArgs& a, EncodeSmem<G>& sm, const SlotState& st, int tid) {
  using Geo = GroupGeometry<G>;
  int64_t dst = 0;
  int nbytes = 0;
  if (st.encode) {
    const TokenInfo ti = a.info[st.span.t];
    const uint64_t blk_off = st.span.t == 0 ? 0ull : a.ends[st.span.t - 1];
    uint8_t* blk = a.payload + blk_off;
    if (st.span.gi == 0) {
      blk[0] = static_cast<uint8_t>(ti.bits);
      blk[1] = static_cast<uint8_t>(static_cast<int8_t>(ti.exp));
    }
    int piv = -1;
    if (a.flag != nullptr && a.flag[st.k] != 0) {
      piv = a.pivot[st.k];
      blk[PivotsOffset(a.ng) + (a.ordinal[st.k] - ti.first_ordinal)] = static_cast<uint8_t>(piv);
    }
    float* v = sm.stage.v + tid * Geo::kVStride;
    uint8_t* params3 = blk + ParamsOffset(st.span.gi);
    uint8_t* codes = sm.codes + tid * Geo::kCStride;
    if constexpr (Geo::kRegisters) {
      EncodeGroup<G>(v, st.span.n, ti.exp, ti.bits, piv, a.norm, params3, codes);
    } else {
      EncodeGroupInPlace<G>(v, st.span.n, ti.exp, ti.bits, piv, a.norm, params3, codes);
    }
    dst = static_cast<int64_t>(blk_off) + CodesOffset(a.ng, ti.flagged, st.span.gi, G, ti.bits);
    nbytes = (st.span.n * ti.bits + 7) / 8;
  }
  sm.stage.off[tid] = dst;
  sm.stage.n[tid] = nbytes;
}

// Phase 4 of the encoder (after a barrier): the block's codes out, consecutive threads storing
// consecutive bytes of a slot.
template <int G>
LONGHAUL_HD LONGHAUL_GQ_INLINE void WriteCodes(const EncodeSmem<G>& sm, int tid, uint8_t* payload) {
  using Geo = GroupGeometry<G>;
  for (int row = 0; row < G; ++row) {
    const int q = row * Geo::kGroups + tid;
    const int slot = q >> Geo::kLog, b = q & (G - 1);
    if (b < sm.stage.n[slot]) payload[sm.stage.off[slot] + b] = sm.codes[slot * Geo::kCStride + b];
  }
}

}  // namespace longhaul::codec::gpu

#endif  // LONGHAUL_CODEC_CUDA_GROUP_QUANT_GROUP_H_
