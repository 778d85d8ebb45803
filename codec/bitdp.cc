#include "codec/bitdp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codec/cpu/kernels_common.h"

namespace longhaul::codec {
namespace {

int64_t PlaneBytes(int64_t cols) { return (cols + 7) / 8; }

float ScaleAt(const uint8_t* b, int64_t i) {
  float s;
  std::memcpy(&s, b + 4 * i, 4);
  return s;
}

}  // namespace

uint64_t BitDpPayloadBytes(int64_t rows, int64_t cols, int bits) {
  return static_cast<uint64_t>(rows) * (4 + static_cast<uint64_t>(bits) * PlaneBytes(cols));
}

void BitDpEncode(const float* g, int64_t rows, int64_t cols, int bits, std::string* out) {
  const size_t base = out->size();
  out->resize(base + BitDpPayloadBytes(rows, cols, bits), '\0');
  uint8_t* b = reinterpret_cast<uint8_t*>(&(*out)[base]);
  uint8_t* planes = b + 4 * rows;
  const int64_t pb = PlaneBytes(cols);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = g + i * cols;
    // Sums in the 32-lane order of kernels.h (lane j takes the columns j mod 32), so a CUDA warp
    // per row (codec/cuda/bitdp.cu) reproduces them bit for bit.
    double lanes[kSumLanes] = {};
    for (int64_t j = 0; j < cols; ++j) lanes[j % kSumLanes] += std::fabs(row[j]);
    const double abs_sum = ReduceLanes32(lanes);
    const double mean_abs = cols > 0 ? abs_sum / cols : 0.0;
    uint8_t* plus = planes + i * bits * pb;
    float s;
    if (bits == 1) {
      for (int64_t j = 0; j < cols; ++j) {
        if (row[j] >= 0) plus[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
      }
      s = static_cast<float>(mean_abs);
    } else {
      uint8_t* minus = plus + pb;
      const float alpha = static_cast<float>(kBitDpAlpha * mean_abs);
      double kept_lanes[kSumLanes] = {};
      int64_t kept = 0;
      for (int64_t j = 0; j < cols; ++j) {
        if (row[j] >= alpha) {
          plus[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
        } else if (row[j] < -alpha) {
          minus[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
        } else {
          continue;
        }
        kept_lanes[j % kSumLanes] += std::fabs(row[j]);
        ++kept;
      }
      const double kept_sum = ReduceLanes32(kept_lanes);
      s = kept > 0 ? static_cast<float>(kept_sum / kept) : 0.0f;
    }
    if (!std::isfinite(s)) s = 0;
    std::memcpy(b + 4 * i, &s, 4);
  }
}

absl::Status BitDpValidate(absl::string_view payload, int64_t rows, int64_t cols, int bits) {
  if (bits != 1 && bits != 2) return absl::InvalidArgumentError(absl::StrCat("bitdp: bits ", bits, " is not 1 or 2"));
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("bitdp: negative shape");
  const uint64_t want = BitDpPayloadBytes(rows, cols, bits);
  if (payload.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("bitdp payload is ", payload.size(), " bytes, [", rows, ", ", cols, "] needs ", want));
  }
  const uint8_t* b = reinterpret_cast<const uint8_t*>(payload.data());
  for (int64_t i = 0; i < rows; ++i) {
    const float s = ScaleAt(b, i);
    if (!std::isfinite(s) || s < 0) return absl::InvalidArgumentError(absl::StrCat("bitdp row ", i, " has scale ", s));
  }
  const int64_t pb = PlaneBytes(cols);
  const uint8_t pad_mask = cols % 8 == 0 ? 0 : static_cast<uint8_t>(0xff << (cols % 8));
  const uint8_t* planes = b + 4 * rows;
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* plus = planes + i * bits * pb;
    for (int p = 0; p < bits; ++p) {
      if (pb > 0 && (plus[p * pb + pb - 1] & pad_mask) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("bitdp row ", i, ": padding bits are not zero"));
      }
    }
    if (bits == 2) {
      for (int64_t k = 0; k < pb; ++k) {
        if (plus[k] & plus[pb + k]) {
          return absl::InvalidArgumentError(absl::StrCat("bitdp row ", i, ": an entry is both +1 and -1"));
        }
      }
    }
  }
  return absl::OkStatus();
}

void BitDpReduceValidated(const std::vector<absl::string_view>& payloads, int64_t rows, int64_t cols, int bits,
                          BitDpReduction reduction, float* out) {
  const int64_t pb = PlaneBytes(cols);
  const double P = static_cast<double>(payloads.size());
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = out + i * cols;
    std::memset(dst, 0, static_cast<size_t>(cols) * sizeof(float));
    double scale_sum = 0;
    for (absl::string_view pl : payloads) scale_sum += ScaleAt(reinterpret_cast<const uint8_t*>(pl.data()), i);
    for (absl::string_view pl : payloads) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(pl.data());
      // Exact: each replica's codes weighted by its own scale. Approximate: codes summed with
      // weight 1, scaled by mean(s) afterwards.
      const float w = reduction == BitDpReduction::kExact ? ScaleAt(b, i) : 1.0f;
      const uint8_t* plus = b + 4 * rows + i * bits * pb;
      for (int64_t k = 0; k < pb; ++k) {
        const uint8_t pbits = plus[k];
        const uint8_t mbits = bits == 1 ? static_cast<uint8_t>(~pbits) : plus[pb + k];
        const int64_t j0 = k * 8;
        const int lim = static_cast<int>(std::min<int64_t>(8, cols - j0));
        for (int t = 0; t < lim; ++t) {
          dst[j0 + t] += w * static_cast<float>(((pbits >> t) & 1) - ((mbits >> t) & 1));
        }
      }
    }
    if (reduction == BitDpReduction::kApproximate && P > 0) {
      const float f = static_cast<float>(scale_sum / P);
      for (int64_t j = 0; j < cols; ++j) dst[j] *= f;
    }
  }
}

void BitDpDecode(absl::string_view payload, int64_t rows, int64_t cols, int bits, float* out) {
  // One payload: the exact reduction is the decode.
  BitDpReduceValidated({payload}, rows, cols, bits, BitDpReduction::kExact, out);
}

absl::Status BitDpReduce(const std::vector<absl::string_view>& payloads, int64_t rows, int64_t cols, int bits,
                         BitDpReduction reduction, float* out) {
  for (size_t p = 0; p < payloads.size(); ++p) {
    if (absl::Status s = BitDpValidate(payloads[p], rows, cols, bits); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("replica ", p, ": ", s.message()));
    }
  }
  BitDpReduceValidated(payloads, rows, cols, bits, reduction, out);
  return absl::OkStatus();
}

bool BitDpAppliesTo(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || !absl::EndsWith(name, ".weight")) return false;
  for (const char* layer : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    if (absl::EndsWith(name, layer)) return true;
  }
  return false;
}

}  // namespace longhaul::codec
