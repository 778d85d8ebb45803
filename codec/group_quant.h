// Grouped asymmetric quantisation of a [tokens, dim] float matrix: the engine behind the `int<k>`
// and `tahquant` codecs (codec.h). Plain buffers in and out; no torch, no protobuf, so decoders can
// be fuzzed in isolation.
//
// Per token (row): a bit width b (bits_hi or bits_lo) and a power-of-two exponent E. Per group of G
// consecutive channels: lo and scale as mf12 minifloats relative to 2^E (minifloat.h), and a flag
// saying the group was pivot-swapped and Hadamard-transformed; for flagged groups, the pivot index.
// Codes q = round((v - lo) / scale) in [0, 2^b - 1], bit-packed.
//
// TAH-Quant (the TAH-Quant paper), all switchable for ablations:
//  - adaptive bits: tokens ranked by entropy H = -sum p log2 p, p = |x| / (|x|_1 + eps), computed
//    as (log2(|x|_1 + eps) |x|_1 - sum |x| log2 |x|) / (|x|_1 + eps) from two sums and a fixed
//    polynomial log2 (TokenEntropy, codec/cpu/kernels_common.h);
//    the top `ratio` fraction get bits_hi, the rest bits_lo. adaptive=false keeps the same count
//    of bits_hi tokens but picks them by a fixed hash of the token index (same bit budget,
//    no entropy signal).
//  - outlier groups: rho = a1 / (a2 + eps) over the two largest |g_i|; rho > tau (computed as
//    a1 > tau (a2 + eps): IsOutlierGroup) -> swap the largest into position 0 and apply the
//    orthonormal fast Walsh-Hadamard transform.
//
// Payload layout, one block per token, in token order:
//   u8 bits | i8 E | ng x 3 bytes params | one byte per flagged group: pivot | packed codes
// params (24 bits, little-endian): bits 0..11 lo (mf12), bits 12..22 scale magnitude (mf12 with
// sign bit reused), bit 23 = transformed flag.
#ifndef LONGHAUL_CODEC_GROUP_QUANT_H_
#define LONGHAUL_CODEC_GROUP_QUANT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/cpu/kernels.h"

namespace longhaul::codec {

// Default outlier threshold, chosen by measurement (docs/codec-results.md, "choosing tau").
inline constexpr float kDefaultTau = 2.0f;

struct GroupQuantParams {
  int group_size = 64;  // power of two in [8, 256]
  int bits_hi = 4;      // 2..8
  int bits_lo = 3;      // 2..bits_hi
  float ratio = 0.8f;   // fraction of tokens at bits_hi, [0, 1]
  bool adaptive = true;
  bool hadamard = true;
  float tau = kDefaultTau;  // > 0

  std::array<uint8_t, 16> Serialize() const;
  static absl::StatusOr<GroupQuantParams> Parse(const std::array<uint8_t, 16>& raw);
  absl::Status Validate() const;
};

struct GroupQuantStats {
  int64_t groups = 0;
  int64_t transformed_groups = 0;
  int64_t tokens_hi = 0;
};

// Token exponent range the encoder produces and the decoder accepts: |x| <= 2^100.
inline constexpr int kMinTokenExp = -120;
inline constexpr int kMaxTokenExp = 104;

// Appends the payload to *out (which may already hold a frame header).
absl::Status GroupQuantEncode(const float* x, int64_t tokens, int64_t dim,
                              const GroupQuantParams& p, int threads, const Kernels& k,
                              std::string* out, GroupQuantStats* stats);

// Byte offset of every token block (size tokens + 1), after a complete validation of the payload.
struct GroupQuantLayout {
  std::vector<uint64_t> token_offset;
};

// Validates every byte that decoding will read. Allocates at most O(payload size).
absl::StatusOr<GroupQuantLayout> GroupQuantValidate(absl::string_view payload, int64_t tokens,
                                                    int64_t dim, const GroupQuantParams& p);

// Decodes a validated payload into out[tokens * dim].
void GroupQuantDecode(absl::string_view payload, const GroupQuantLayout& layout, int64_t tokens,
                      int64_t dim, const GroupQuantParams& p, int threads, const Kernels& k,
                      float* out);

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_GROUP_QUANT_H_
