// Grouped asymmetric quantisation (int<k>, tahquant) on a CUDA device: the payload of
// group_quant.h, byte for byte.
//
// Encoding works on whole tokens: a block of 256 threads on a token (group_quant_tokens.cuh), the
// row's octets loaded with 16-byte loads (into registers, or staged in shared memory for int<k> and
// for rows of several chunks) and every per-group step done by lane segments in registers. Two
// shapes of the work:
//  - int<k> (one bit width, no Hadamard): every token block has the same size, so one kernel does
//    it all (FusedEncode): statistics (the maximum of |x| and the NaN/Inf/huge check, with the
//    CPU's errors; the token exponent), then the groups from the row still in shared memory. The
//    input is read once.
//  - otherwise (tahquant): the block sizes depend on the bit allocation over all tokens and on
//    the outlier flags, so
//      1. TokenStatsKernel (group_quant_stats.cuh): statistics (the token sums in the CPU's
//         2048-lane order, straight from global memory), the entropy (adaptive TAH-Quant) and the
//         outlier test of every group (kept for step 3, and counted per token), each token's
//         allocation key counted in global histograms, the input read once, several tokens a
//         block (a short row's next token loaded while this one is worked on);
//      2. AllocateCandidates and AllocateBits (group_quant_alloc.cuh), a block per tile of
//         tokens each: the set of bits_hi tokens nth_element picks on the CPU (a radix select
//         whose top 16 or 24 bits come from the histograms, the rest from the keys that share them),
//         each token's bits and block end, and the results word, written straight into pinned
//         host memory;
//      3. EncodeTokens: the tokens again, last first (the statistics pass's last rows are still in
//         L2), the kept outlier tests, the flagged groups' ordinals by a block-wide count,
//         header, params, pivots and codes (EncodeRow's phases); a one-chunk token's loads all
//         issued before the first is used.
// The host waits for the allocation's results (payload size, error word, in pinned memory), not
// for the encode kernel: the call returns while it runs, as the other encoders return before
// theirs (int<k>'s fused kernel: the host synchronises once).
//
// This file launches the kernels and waits for the results; the encode's own kernels (EncodeRow,
// EncodeTokens, FusedEncode) are in group_quant_encode.cuh. Decoding: group_quant_decode.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "codec/cpu/kernels.h"
#include "codec/cpu/kernels_common.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"
#include "codec/cuda/group_quant_alloc.cuh"
#include "codec/cuda/group_quant_encode.cuh"
#include "codec/cuda/group_quant_group.h"
#include "codec/cuda/group_quant_stats.cuh"
#include "codec/cuda/group_quant_tokens.cuh"

namespace longhaul::codec::gpu {
namespace {

using gqa::Results;
using gqe::EncArgs;
using gqe::EncodeTokens;
using gqe::FusedEncode;
using gqt::kThreads;

// A hint to the core that the thread is spinning (the other hardware thread, if any, runs).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waits until AllocateBits has written call `seq`'s results into the pinned area (Results::seq,
// written last): the payload's size is then known while the encode kernel still runs, and the
// caller's next work on the stream queues behind it (a call's kernels then follow the previous
// call's without the host's wake-up and launch between them). Polls the word; every kStreamPolls
// polls asks whether the stream has failed, or ended without the word (a kernel that failed).
absl::Status WaitForResults(const Results* res, unsigned long long seq, cudaStream_t st) {
  constexpr unsigned kStreamPolls = 4096;
  // An acquire load: the results are read after the number.
  auto arrived = [&] { return __atomic_load_n(&res->seq, __ATOMIC_ACQUIRE) == seq; };
  for (unsigned polls = 1; !arrived(); ++polls) {
    CpuRelax();
    if (polls % kStreamPolls != 0) continue;
    const cudaError_t e = cudaStreamQuery(st);
    if (e == cudaErrorNotReady) continue;
    if (e != cudaSuccess) return CudaStatus(e, "encode kernels");
    if (arrived()) break;
    return absl::InternalError("the allocation kernel ended without writing its results");
  }
  return absl::OkStatus();
}

// The fused encode's results word before its kernel (a kernel, not a copy from pageable host memory).
__global__ void InitResults(Results* res) { *res = Results{ULLONG_MAX, 0, 0, 0}; }

// Scratch slots of the workspace, and what they hold during an encode (the decoder, in
// group_quant_decode.cu, uses kOffsets only; the fused int<k> encode only kTemp and kPayload; the
// symmetric and BitDP codecs use kPayload):
//   kInfo        TokenInfo per token
//   kTokens      the statistics' and the allocation's per-token arrays (gqa::TokenArrays)
//   kPivots      each group's pivot or -1 (the outlier test of the statistics pass, for the encode)
//   kHist        the allocation's histograms of key digits: zero between encodes (ZeroedScratch;
//                the allocation clears them after use)
//   kOffsets     the block ends (inclusive scan of the sizes)
//   kTemp        the fused encode's Results word; otherwise the allocation's gqa::AllocScratch
//   kPayload     the payload (worst case: every group flagged, every token at bits_hi)
enum Slot { kInfo = 0, kPivots = 1, kTokens = 2, kHist = 3, kOffsets = 5, kTemp = 6, kPayload = 7 };

// gqa::TokenArrays in one scratch area of TokenArraysBytes(tokens) bytes, each array 32-byte aligned.
size_t Aligned32(size_t bytes) { return (bytes + 31) / 32 * 32; }
size_t TokenArraysBytes(size_t tokens) { return 2 * Aligned32(4 * tokens) + Aligned32(8 * tokens) + tokens; }
gqa::TokenArrays TokenArraysAt(void* base, size_t tokens) {
  auto* b = static_cast<uint8_t*>(base);
  const size_t f32 = Aligned32(4 * tokens), u64 = Aligned32(8 * tokens);
  return gqa::TokenArrays{reinterpret_cast<float*>(b), reinterpret_cast<int32_t*>(b + f32),
                          reinterpret_cast<uint64_t*>(b + 2 * f32), b + 2 * f32 + u64};
}
static_assert(kOffsets == 5, "group_quant_decode.cu names the offsets slot 5");
static_assert(kPayload == Workspace::kSlots - 1, "the payload slot is the last, as the other codecs'");

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
  // Row indices are 32-bit (with room for a block's octets past the end).
  if (dim > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("rows of ", dim, " elements: more than the GPU encoder takes (2^30)"));
  }
  const int g = p.group_size;
  const int64_t ng64 = (dim + g - 1) / g;
  // Group indices are 32-bit.
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
  // int<k>: one width and no flags, so every token block has the same size and one pass suffices.
  const bool fused = !two_widths && !flags;
  const int64_t fixed_bytes = PivotsOffset(ng);
  const int64_t max_block = 2 + 4 * static_cast<int64_t>(ng) + PackedBytes(dim, p.bits_hi);
  const int64_t n_hi = two_widths ? std::llround(static_cast<double>(p.ratio) * static_cast<double>(tokens)) : tokens;
  const bool select = !fused && gqa::Selects(n_hi, tokens);
  // Every slot before the first launch: growing one synchronises the device.
  const size_t tok = static_cast<size_t>(tokens);
  auto maybe = [&](int slot, size_t bytes) -> absl::StatusOr<void*> {
    if (bytes == 0) return static_cast<void*>(nullptr);
    return ws.Scratch(slot, bytes);
  };
  absl::StatusOr<void*> info = maybe(kInfo, fused ? 0 : sizeof(TokenInfo) * tok);
  absl::StatusOr<void*> token_arrays = maybe(kTokens, fused ? 0 : TokenArraysBytes(tok));
  absl::StatusOr<void*> pivots = maybe(kPivots, flags ? sizeof(int16_t) * tok * static_cast<size_t>(ng) : 0);
  absl::StatusOr<void*> offsets = maybe(kOffsets, fused ? 0 : sizeof(unsigned long long) * tok);
  absl::StatusOr<void*> payload = ws.Scratch(kPayload, static_cast<size_t>(max_block) * tok);
  absl::StatusOr<void*> temp =
      maybe(kTemp, fused ? sizeof(Results) : sizeof(gqa::AllocScratch));
  absl::StatusOr<void*> hist = select ? ws.ZeroedScratch(kHist, sizeof(unsigned) * gqa::kHistWords, s)
                                      : absl::StatusOr<void*>(nullptr);
  absl::StatusOr<void*> pinned = ws.Pinned();
  absl::StatusOr<void*> pinned_dev = ws.PinnedOnDevice();
  for (const auto* r : {&info, &token_arrays, &pivots, &offsets, &payload, &temp, &hist, &pinned, &pinned_dev}) {
    if (!r->ok()) return r->status();
  }
  auto* ti = static_cast<TokenInfo*>(*info);
  auto* piv = static_cast<int16_t*>(*pivots);
  auto* res = static_cast<Results*>(*pinned);
  auto* out = static_cast<uint8_t*>(*payload);
  // From the first launch on, a call that returns an error synchronises first, so no kernel of it
  // outlives the call (the caller's next use of the workspace may be on another stream); until the
  // allocation has been queued, the histograms may hold counts, left for the next encode's
  // ZeroedScratch to clear. A good call returns with its encode kernel running: the caller orders
  // its next use of the workspace after the stream's work (gpu_codec.h).
  struct UntilReturned {
    Workspace& ws;
    cudaStream_t st;
    bool returned_payload = false;
    bool hist_in_use = false;
    ~UntilReturned() {
      if (returned_payload) return;
      (void)cudaStreamSynchronize(st);
      if (hist_in_use) ws.MarkDirty(kHist);
    }
  } guard{ws, st};

  EncArgs args{};
  args.tokens = tokens;
  args.dim = dim;
  args.ng = ng;
  args.norm = HadamardNorm(g);
  args.flags = flags;
  args.payload = out;
  const unsigned grid = static_cast<unsigned>(tokens);
  uint64_t total = 0;
  unsigned long long alloc_seq = 0;  // (not fused) the number AllocateBits writes after the results
  if (fused) {
    auto* dres = static_cast<Results*>(*temp);
    InitResults<<<1, 1, 0, st>>>(dres);
    LONGHAUL_CUDA_OK(cudaGetLastError());
    const int64_t block = fixed_bytes + PackedBytes(dim, p.bits_hi);
    args.fused_bits = p.bits_hi;
    args.fused_block = block;
    args.res = dres;
    total = static_cast<uint64_t>(block) * static_cast<uint64_t>(tokens);
    absl::Status launched = WithGroupSize(g, [&](auto gc) {
      return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
        FusedEncode<decltype(gc)::value><<<grid, kThreads, 0, st>>>(xt, args);
        return CudaStatus(cudaGetLastError(), "fused encode kernel");
      });
    });
    if (!launched.ok()) return launched;
    LONGHAUL_CUDA_OK(cudaMemcpyAsync(res, dres, sizeof(Results), cudaMemcpyDeviceToHost, st));
  } else {
    // The allocation writes the results word straight into the pinned host area.
    auto* res_dev = static_cast<Results*>(*pinned_dev);
    auto* scratch = static_cast<gqa::AllocScratch*>(*temp);
    auto* hist_words = static_cast<unsigned*>(*hist);
    const gqa::TokenArrays arrays = TokenArraysAt(*token_arrays, tok);
    guard.hist_in_use = true;
    // Each kernel after the first is a dependent launch of the one before (cuda_util.cuh): the
    // allocation's two kernels of the statistics and of each other, the encode of the allocation.
    // Several tokens a block (its setup shared), one wave of blocks: as many as fit on the SMs.
    const gqs::StatsArgs stats_args{tokens, static_cast<int>(dim), entropy, flags, p.tau, ti, arrays, piv, hist_words};
    absl::Status stats_launched = WithGroupSize(g, [&](auto gc) {
      return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(xt)>>;
        const auto kernel = gqt::FitsShortRow(xt, dim) ? gqs::TokenStatsKernel<decltype(gc)::value, T, true>
                                                       : gqs::TokenStatsKernel<decltype(gc)::value, T, false>;
        absl::StatusOr<int> blocks = ResidentBlocks(reinterpret_cast<const void*>(kernel), kThreads);
        if (!blocks.ok()) return blocks.status();
        const auto n = static_cast<unsigned>(std::min<int64_t>(tokens, *blocks));
        kernel<<<n, kThreads, 0, st>>>(xt, stats_args);
        return CudaStatus(cudaGetLastError(), "token statistics kernel");
      });
    });
    if (!stats_launched.ok()) return stats_launched;
    alloc_seq = ws.NextPinnedSeq();
    const gqa::AllocArgs alloc{tokens, n_hi, p.adaptive, p.bits_hi, p.bits_lo, fixed_bytes, dim, gqa::TileTokens(tokens),
                               alloc_seq};
    const auto tiles = static_cast<unsigned>(gqa::NumTiles(tokens));
    auto* ends = static_cast<unsigned long long*>(*offsets);  // ends[t]: the end of token t's block
    if (absl::Status s = LaunchDependent(gqa::AllocateCandidates, tiles, gqa::kAllocThreads, st,
                                         "allocation's candidates kernel", alloc, arrays,
                                         static_cast<const unsigned*>(hist_words), scratch);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = LaunchDependent(gqa::AllocateBits, tiles, gqa::kAllocThreads, st, "allocation kernel", alloc,
                                         arrays, static_cast<const gqa::AllocScratch*>(scratch), hist_words, ends,
                                         res_dev);
        !s.ok()) {
      return s;
    }
    guard.hist_in_use = false;  // the allocation clears them once it runs
    args.info = ti;
    args.bits = arrays.bits;
    args.pivots = piv;
    args.ends = ends;
    absl::Status encode_launched = WithGroupSize(g, [&](auto gc) {
      return WithInputType(x, dtype, [&](const auto* xt) -> absl::Status {
        return LaunchDependent(EncodeTokens<decltype(gc)::value, std::remove_cv_t<std::remove_pointer_t<decltype(xt)>>>,
                               grid, kThreads, st, "encode kernel", xt, args);
      });
    });
    if (!encode_launched.ok()) return encode_launched;
  }
  if (fused) {
    LONGHAUL_CUDA_OK(cudaStreamSynchronize(st));
  } else if (absl::Status waited = WaitForResults(res, alloc_seq, st); !waited.ok()) {
    return waited;
  }
  if (res->first_bad != ULLONG_MAX) {
    const unsigned long long bad = res->first_bad >> 1;
    return absl::InvalidArgumentError((res->first_bad & 1)
                                          ? absl::StrCat("input magnitude above 2^100 in token ", bad,
                                                         " (use the fp32 codec for such tensors)")
                                          : absl::StrCat("input has a NaN or Inf in token ", bad));
  }
  if (!fused) total = res->total;
  if (stats != nullptr) {
    stats->groups = groups;
    stats->transformed_groups = static_cast<int64_t>(res->transformed);
    stats->tokens_hi = n_hi;
  }
  guard.returned_payload = true;
  return DeviceBytes{out, static_cast<size_t>(total)};
}

}  // namespace longhaul::codec::gpu
