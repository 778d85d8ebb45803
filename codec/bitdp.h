// BitDP (the BitDP paper): 1-bit and 2-bit (ternary) gradient quantisation per output channel,
// bit-plane packing, and the all-gather-then-reduce that sums P replicas' packed gradients bit by
// bit without materialising P dense tensors.
//
// A gradient matrix is [rows, cols] with one row per output channel (torch Linear weights are
// [out, in]). Per row i:
//   1-bit: q_ij = +1 if g_ij >= 0 else -1;  s_i = mean_j |g_ij|.
//   2-bit: alpha_i = 3/4 mean_j |g_ij|;  q_ij = +1 if g_ij >= alpha_i, -1 if g_ij < -alpha_i, else 0;
//          s_i = mean |g_ij| over the kept entries (q_ij != 0; 0 when none is kept).
// Payload: rows little-endian float32 scales, then per row one plane (1-bit: the +1 mask) or two
// planes (2-bit: the +1 mask, then the -1 mask) of ceil(cols / 8) bytes, LSB first, padding bits 0.
// Bits per element = bits + 32 / cols (+ the frame header).
//
// Reductions over P replicas (both estimate the SUM; divide by P for the mean):
//   exact:        sum_p s_p,i * q_p,ij         (per-replica scales gathered, one float per row each)
//   approximate:  (1/P) (sum_p s_p,i) (sum_p q_p,ij)   — the paper's eq. (10), scales all-reduced;
//                 equal to the exact sum only when every replica has the same scale.
#ifndef LONGHAUL_CODEC_BITDP_H_
#define LONGHAUL_CODEC_BITDP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace longhaul::codec {

// The paper's threshold factor for 2-bit: alpha = kBitDpAlpha * mean |g|.
inline constexpr float kBitDpAlpha = 0.75f;

uint64_t BitDpPayloadBytes(int64_t rows, int64_t cols, int bits);

// Appends the payload of g[rows * cols] to *out. bits is 1 or 2.
void BitDpEncode(const float* g, int64_t rows, int64_t cols, int bits, std::string* out);

// Checks length, scales (finite, >= 0), padding bits, and (2-bit) that no entry is both +1 and -1.
absl::Status BitDpValidate(absl::string_view payload, int64_t rows, int64_t cols, int bits);

// out = s * q for a validated payload.
void BitDpDecode(absl::string_view payload, int64_t rows, int64_t cols, int bits, float* out);

enum class BitDpReduction { kExact, kApproximate };

// out[rows * cols] = the reduction of P validated payloads (validated here too), decoding bit by
// bit into the output row: memory is O(output), not O(P x output).
absl::Status BitDpReduce(const std::vector<absl::string_view>& payloads, int64_t rows, int64_t cols, int bits,
                         BitDpReduction reduction, float* out);
// The same for payloads that each passed BitDpValidate (a caller that validates them one by one, to
// name the sender of a bad one, need not have them checked twice).
void BitDpReduceValidated(const std::vector<absl::string_view>& payloads, int64_t rows, int64_t cols, int bits,
                          BitDpReduction reduction, float* out);

// Which parameters BitDP quantises: the weight matrices of linear layers (attention QKV and output
// projection, both MLP matrices). Biases, embeddings, norms and the LM head stay full precision
// (the paper found quantising them destabilises training). Names as in stage_runtime/model.h.
bool BitDpAppliesTo(const std::string& param_name, const std::vector<int64_t>& shape);

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_BITDP_H_
