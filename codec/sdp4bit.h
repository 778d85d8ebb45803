// SDP4Bit (Jia et al., NeurIPS 2024) and the ZeRO++ baselines (Wang et al., 2023) as the pieces a
// replica collective needs, plus reference simulations of P replicas used by tests and benchmarks.
// All on plain float buffers; the wire format of every piece is sym_quant.h's payload.
//
// qWD — weight differences (INT4, group 2048): each replica owns a shard of the fp32 main weights;
// after its optimizer step it sends Quantise(main - model) for its shard, and every replica adds
// the dequantised shard to its model copy, so all copies stay bit-identical and the error does not
// accumulate (the next difference is taken against the updated model).
//
//   std::string d = QwdEncodeShard(main_shard, model_shard, n);      // all-gathered
//   QwdApplyShard(d, n, model_shard_on_every_replica);              // same bytes -> same result
//
// TLq-HS — two-level gradient reduce-scatter: Hadamard (block 32, fused into the quantiser), INT8
// inside a region (fast level), reduce in the Hadamard domain, INT4 across regions (slow level),
// reduce, one inverse Hadamard on the owned shard. ULq (ZeRO++ qgZ: INT4 at both levels, no
// Hadamard) and TLq (INT8/INT4, no Hadamard) are the same procedure with other settings.
#ifndef LONGHAUL_CODEC_SDP4BIT_H_
#define LONGHAUL_CODEC_SDP4BIT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/sym_quant.h"

namespace longhaul::codec {

// ------------------------------------------------------------------------------------------ qWD

inline SymQuantParams QwdParams(int group_size = 2048) { return {4, group_size, false, Rounding::kNearest}; }

// Quantised main - model for one shard (the bytes to all-gather).
std::string QwdEncodeShard(const float* main, const float* model, int64_t n, const SymQuantParams& p = QwdParams(),
                           int64_t index_offset = 0);
// model += dequant(payload). Validates first; the model is untouched on error.
absl::Status QwdApplyShard(absl::string_view payload, int64_t n, float* model, const SymQuantParams& p = QwdParams());
// One replica, whole tensor: model += dequant(quant(main - model)).
void QwdSync(const float* main, float* model, int64_t n, const SymQuantParams& p = QwdParams());

// The generic update rules of the paper's Algorithm 4 with an arbitrary weight compressor C (used
// by the Counterexample 4.1 test with the paper's ternary quantiser):
//   weight quantisation (qW):            model = C(main)
//   weight-difference quantisation (qWD): model = model + C(main - model)
using Compressor = std::function<std::vector<float>(const std::vector<float>&)>;
void ApplyWeightQuantisation(const std::vector<float>& main, std::vector<float>* model, const Compressor& c);
void ApplyWeightDifference(const std::vector<float>& main, std::vector<float>* model, const Compressor& c);

// -------------------------------------------------------------------------------- two-level

struct TwoLevelConfig {
  int fast_bits = 8;    // intra-region level
  int slow_bits = 4;    // inter-region level
  int group_size = 128;
  bool hadamard = true;
  Rounding rounding = Rounding::kNearest;
  SymQuantParams Fast() const { return {fast_bits, group_size, hadamard, rounding}; }
  // Slow-level data is already in the Hadamard domain: no second transform.
  SymQuantParams Slow() const { return {slow_bits, group_size, false, rounding}; }
};
inline TwoLevelConfig TlqHs(Rounding r = Rounding::kNearest) { return {8, 4, 128, true, r}; }
inline TwoLevelConfig Tlq(Rounding r = Rounding::kNearest) { return {8, 4, 128, false, r}; }
inline TwoLevelConfig Ulq(Rounding r = Rounding::kNearest) { return {4, 4, 128, false, r}; }

// The pieces a collective calls. A rank quantises what it sends to each peer (with the fused
// forward Hadamard at the fast level; collective/algorithms.h quantises each shard's part on its
// own, index_offset keeping its elements' draws), and accumulates what it receives without leaving
// the Hadamard domain; the owner of a shard applies FinishShard once at the end.
std::string QuantiseFast(const float* slice, int64_t n, const TwoLevelConfig& c, uint64_t seed, int64_t index_offset = 0);
std::string QuantiseSlow(const float* partial, int64_t n, const TwoLevelConfig& c, uint64_t seed, int64_t index_offset = 0);
absl::Status AccumulateFast(absl::string_view payload, int64_t n, const TwoLevelConfig& c, float* acc);
absl::Status AccumulateSlow(absl::string_view payload, int64_t n, const TwoLevelConfig& c, float* acc);
void FinishShard(float* shard, int64_t n, const TwoLevelConfig& c);  // inverse Hadamard if enabled

// qgZ's tensor-slice order: with X ranks per region and Y regions the tensor is cut into X*Y
// chunks and the slice sent to local rank x is chunks [x, X + x, 2X + x, ..., (Y-1)X + x], so after
// the inter-region all-to-all global rank y*X + x owns chunk y*X + x. Returns the chunk order
// (concatenation of the slices): [0, X, 2X, ..., (Y-1)X, 1, X+1, ...].
std::vector<int> QgzChunkOrder(int per_region, int regions);

// Reference simulation of the two-level reduce-scatter among P = grads.size() replicas in
// `regions` equal regions (rank r is in region r / (P / regions)), with real per-message
// quantisation and the qgZ slice order. Returns the reduced SUM in the tensor's element order,
// assembled from the shards their owners hold after the reduce-scatter (comparable with
// sum_p grads[p]); `owner` (optional) receives, per element, the global rank that owns it.
absl::StatusOr<std::vector<float>> SimulateTwoLevelReduce(const std::vector<std::vector<float>>& grads, int regions,
                                                          const TwoLevelConfig& c, uint64_t seed,
                                                          std::vector<int>* owner = nullptr);

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_SDP4BIT_H_
