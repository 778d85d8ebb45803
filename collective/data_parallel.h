// One data-parallel step among a stage's replicas, per codec: synchronise the gradients, run the
// optimizer (the caller's, on the range this rank owns) and leave every replica's weights
// bit-identical. Torch-free: a flat float buffer (the caller flattens its parameters, or buckets).
//
//   DpOptions o = DefaultDpOptions(DpCodec::kSdp4Bit);
//   absl::StatusOr<std::unique_ptr<DataParallelSync>> dp = DataParallelSync::Create(&group, n, o);
//   // each step, on every rank, with this rank's gradient and the (identical) weights:
//   absl::StatusOr<CallStats> s = (*dp)->Step(grad, weights,
//       [&](int64_t offset, absl::Span<const float> grad_sum, absl::Span<float> main) {
//         adam.Update(offset, grad_sum, P, main);   // grad_sum is the SUM over the P replicas
//       });
//
// Codecs:
//   fp32     ZeRO-style: ring reduce-scatter of the gradients, the owner updates its shard, ring
//            all-gather of the new weights (the same bytes as a ring all-reduce).
//   sdp4bit  SDP4Bit (Jia et al. 2024): TLq-HS gradient reduce-scatter (algorithms.h: INT8 inside a
//            region, INT4 across, Hadamard smoothing); the owner keeps the fp32 main weights and
//            the optimizer state of its shard; qWD all-gather: each owner sends Q(main - model) of
//            its shard (INT4, group 2048) and every rank, the owner too, adds the same dequantised
//            bytes to its model copy.
//   zeropp   the ZeRO++ baselines at the same bits: qgZ (two-level INT4 reduce-scatter, no
//            Hadamard) and qwZ (the owner's main weights quantised, INT4 group 2048 by default;
//            ZeRO++ itself uses INT8 there: weights.bits = 8), every rank's model = dequant(bytes).
//   bitdp1/2 BitDP: each rank's gradient of each weight matrix as 1-bit or ternary planes with one
//            scale per output channel, all-gathered (two-level); every rank reduces the same bytes
//            in rank order with the exact rule (sum_p s_p q_p), so the summed gradients are
//            identical and the optimizer runs replicated on the whole buffer. Segments that BitDP
//            leaves alone (biases, norms, embeddings: BitDpSegment::quantise = false) are summed
//            with the fp32 ring.
// Memory: the padded gradient (P * chunk floats) plus the main shard.
// Threading: as Group (one rank's thread; the quantised steps run their collectives' buckets'
// transfers on a second thread and BitDP its fp32 ring on a third, Op::RunConcurrently, all joined
// before the step returns).
#ifndef LONGHAUL_COLLECTIVE_DATA_PARALLEL_H_
#define LONGHAUL_COLLECTIVE_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codec/sdp4bit.h"
#include "collective/group.h"

namespace longhaul::collective {

enum class DpCodec { kFp32, kSdp4Bit, kZeroPP, kBitDp1, kBitDp2 };
// "fp32" | "sdp4bit" | "zeropp" | "bitdp1" | "bitdp2" (the job spec's data_parallel.codec).
absl::StatusOr<DpCodec> ParseDpCodec(absl::string_view name);
const char* DpCodecName(DpCodec c);

// A stretch of the flat buffer: a [rows, cols] matrix (rows = output channels), or a vector.
struct BitDpSegment {
  int64_t rows = 1;
  int64_t cols = 0;
  bool quantise = true;  // false: summed in fp32 (codec::BitDpAppliesTo says which)
};

// A parameter of the flattened buffer, in order: name as in stage_runtime/model.h, torch shape.
struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
};
// BitDP's segments for a flattened parameter list: the linear layers' weight matrices
// (codec::BitDpAppliesTo; torch Linear weights are [out, in], so rows = shape[0]) quantised, the
// rest in fp32. Empty parameters are skipped.
std::vector<BitDpSegment> BitDpLayoutFor(const std::vector<ParamShape>& params);

struct DpOptions {
  DpCodec codec = DpCodec::kFp32;
  codec::TwoLevelConfig grad = codec::TlqHs();          // sdp4bit / zeropp gradient reduce-scatter
  codec::SymQuantParams weights = codec::QwdParams();   // qWD (sdp4bit) / qwZ (zeropp)
  // BitDP only: the buffer's segments in order (their sizes must add up to n); empty: one row.
  std::vector<BitDpSegment> bitdp_layout;
  uint64_t seed = 1;  // stochastic rounding, when the configs ask for it (mixed with the step)
  // The quantised codecs' collectives pipelined over this many buckets (1..8; fewer where there is
  // less than kMinBucketElements a bucket; RunBucketPipeline): sdp4bit's / zeropp's gradients' two
  // levels (TwoLevelReduceScatter) and their weights' all-gather against its encode and decode,
  // BitDP's bit planes' all-gather against their encode and reduction. So the link between regions
  // carries one bucket while the next is summed, encoded or decoded. The result does not depend on
  // it, nor do the bytes. (fp32's ring is not bucketed.)
  int buckets = 4;
};
// The most DpOptions::buckets: the weights' all-gather takes two phases a bucket, within its
// part's Op::kPhasesPerPart.
inline constexpr int kMaxBuckets = 8;
// The paper's settings per codec: TLq-HS + qWD INT4/2048 (sdp4bit), ULq + qwZ INT4/2048 (zeropp).
DpOptions DefaultDpOptions(DpCodec c);

// The optimizer step on the owned range: `offset` into the flat buffer, the summed gradient and
// the fp32 main weights of that range, to be updated in place.
using UpdateFn = std::function<void(int64_t offset, absl::Span<const float> grad_sum, absl::Span<float> main)>;

class DataParallelSync {
 public:
  // `group` (not owned) must outlive this. n: elements of the flat buffer.
  static absl::StatusOr<std::unique_ptr<DataParallelSync>> Create(Group* group, int64_t n, DpOptions o);

  const DpOptions& options() const { return o_; }
  const ShardLayout& layout() const { return layout_; }
  // The range whose optimizer state and main weights this rank keeps: its shard for fp32, sdp4bit
  // and zeropp; the whole buffer for BitDP (replicated optimizer).
  int64_t owned_begin() const;
  int64_t owned_length() const;
  // The fp32 main weights of the owned range (for checkpoints); empty before the first step, and
  // always for BitDP, whose optimizer updates the weights themselves.
  absl::Span<const float> main() const { return main_; }
  // A restart from a checkpoint: the main weights of the owned range as main() returned them then
  // (their length must be owned_length()), and the number of steps taken before, which keys the
  // stochastic rounding of the steps to come (as if this object had taken them).
  absl::Status Restore(absl::Span<const float> main, uint64_t steps);

  // grad: this rank's gradient [n]; weights: the model copy [n], identical on every rank on entry
  // (the first step takes its main weights from it) and again on success. On error the weights
  // may be half updated and the group has failed (group.h).
  absl::StatusOr<CallStats> Step(absl::Span<const float> grad, absl::Span<float> weights, const UpdateFn& update);

  // Bytes this rank sends per step (the formulas of algorithms.h), for checks and planning.
  int64_t ExpectedBytesSent() const;

 private:
  DataParallelSync(Group* g, int64_t n, DpOptions o);
  absl::Status StepFp32(Op& op, absl::Span<const float> grad, absl::Span<float> weights, const UpdateFn& update);
  absl::Status StepQuantised(Op& op, absl::Span<const float> grad, absl::Span<float> weights,
                             const UpdateFn& update);
  absl::Status StepBitDp(Op& op, absl::Span<const float> grad, absl::Span<float> weights, const UpdateFn& update);
  int64_t WeightPayloadBytes(int k) const;
  // padded_ = the gradient followed by zeros up to layout_.padded() (one pass: only the tail is
  // zeroed).
  void PadGradient(absl::Span<const float> grad);
  absl::Status GatherWeights(Op& op, absl::Span<float> weights, uint64_t seed);

  Group* const g_;
  const int64_t n_;
  const DpOptions o_;
  const ShardLayout layout_;
  std::vector<float> main_;
  std::vector<float> padded_, shard_;  // reused across steps
  uint64_t steps_ = 0;
};

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_DATA_PARALLEL_H_
