// Symmetric per-group quantisation — the engine behind SDP4Bit (qWD, TLq-HS) and the ZeRO++
// baselines (ULq / qgZ, qwZ / qW) — with an optional block-32 Hadamard transform fused into the
// same pass (as in the SDP4Bit paper). Plain buffers in and out.
//
// Per group of G consecutive elements (the last group may be shorter):
//   s = max |y| over the group, y = H x (H = orthonormal 32x32 Walsh-Hadamard applied to each full
//   block of 32 inside the group when `hadamard`; a tail of fewer than 32 elements at the end of the
//   tensor is left untransformed); Q = 2^(k-1) - 1; the 2Q + 1 levels -s + c * s / Q, c = 0..2Q,
//   are symmetric around zero; the code is c = round_half_even((y + s) * Q / s) (i.e. q = c - Q =
//   round(y / s * Q) up to ties), computed with the shared quantise kernel (codec/cpu/kernels.h).
// Rounding: nearest (deterministic) or stochastic, c = floor((y + s) * Q / s + u), u ~ U[0,1)
// from a counter-based generator keyed by (seed, element index) — unbiased, reproducible.
// Decoding: y' = c * (s / Q) - s, then H y' (H is its own inverse) unless the caller asks to stay in
// the Hadamard domain (TLq-HS reduces there and transforms once at the end).
// Kernels: the scalar reference or AVX2 (BestKernels()), byte-identical (tests/codec).
//
// Payload layout: ngroups little-endian float32 scales, then the codes c of all elements as one
// LSB-first bit stream of k-bit values (0..2Q; the value 2^k - 1 is invalid), zero-padded to a
// whole byte. Bits per element = k + 32 / G (+ the frame header).
//
//   SymQuantParams p{.bits = 4, .group_size = 128, .hadamard = true};
//   std::string payload;  SymQuantEncode(x, n, p, /*seed=*/step, &payload);
//   if (SymQuantValidate(payload, n, p).ok()) SymQuantDecode(payload, n, p, {}, out);
#ifndef LONGHAUL_CODEC_SYM_QUANT_H_
#define LONGHAUL_CODEC_SYM_QUANT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/cpu/kernels.h"
#include "codec/hd.h"
#include "codec/int_util.h"

namespace longhaul::codec {

inline constexpr int kHadamardBlock = 32;

enum class Rounding : uint8_t { kNearest = 0, kStochastic = 1 };

struct SymQuantParams {
  int bits = 4;            // 2..8
  int group_size = 128;    // power of two in [8, 65536]; a multiple of 32 with hadamard
  bool hadamard = false;
  Rounding rounding = Rounding::kNearest;

  absl::Status Validate() const;
  std::array<uint8_t, 16> Serialize() const;
  static absl::StatusOr<SymQuantParams> Parse(const std::array<uint8_t, 16>& raw);
};

uint64_t SymQuantPayloadBytes(int64_t n, const SymQuantParams& p);

// Appends the payload for x[0..n) to *out. `seed` matters only for stochastic rounding; element i
// of a call draws from (seed, index_offset + i), so shards of one tensor can be encoded separately
// with the same draws as the whole.
void SymQuantEncode(const float* x, int64_t n, const SymQuantParams& p, uint64_t seed, std::string* out,
                    int64_t index_offset = 0, const Kernels& k = BestKernels());

// Checks the exact length, every scale (finite, >= 0) and every code (< 2^k - 1) and the padding.
absl::Status SymQuantValidate(absl::string_view payload, int64_t n, const SymQuantParams& p,
                              const Kernels& k = BestKernels());

struct SymDecodeOptions {
  bool accumulate = false;        // out += decoded instead of out = decoded
  bool hadamard_domain = false;   // skip the inverse transform (stay in the Hadamard domain)
};
// Decodes a payload that passed SymQuantValidate.
void SymQuantDecode(absl::string_view payload, int64_t n, const SymQuantParams& p,
                    const SymDecodeOptions& o, float* out, const Kernels& k = BestKernels());

// The orthonormal Walsh-Hadamard transform of every full 32-block of x[0..n) in place (its own
// inverse); a tail shorter than 32 is left as is. The unfused reference the fused paths are tested
// against.
void Hadamard32(float* x, int64_t n);

// Uniform [0, 1) draw for (seed, index): the stochastic-rounding generator. Inline and
// LONGHAUL_HD so the CUDA encoder (codec/cuda/sym_quant.cu) draws the very same numbers. The top 24
// bits of the hash convert to float exactly and the scaling by 2^-24 is exact.
LONGHAUL_HD inline float UniformAt(uint64_t seed, uint64_t index) {
  const uint64_t h = SplitMix64(seed * 0x2545f4914f6cdd1dull ^ SplitMix64(index));
  return static_cast<float>(h >> 40) * 0x1p-24f;
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_SYM_QUANT_H_
