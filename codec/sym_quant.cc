#include "codec/sym_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace longhaul::codec {
namespace {

bool IsPow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

int64_t NumGroups(int64_t n, int g) { return (n + g - 1) / g; }

// In-place orthonormal FWHT of 32 values.
void Fwht32(float* v) {
  for (int h = 1; h < kHadamardBlock; h <<= 1) {
    for (int i = 0; i < kHadamardBlock; i += h << 1) {
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(kHadamardBlock));
  for (int i = 0; i < kHadamardBlock; ++i) v[i] *= norm;
}

// Transforms the full 32-blocks of a group (groups start at multiples of 32, so these are the
// tensor's own blocks; only the tensor's tail can be shorter than a block).
void TransformGroup(float* v, int64_t len) {
  for (int64_t b = 0; b + kHadamardBlock <= len; b += kHadamardBlock) Fwht32(v + b);
}

uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void Put(uint32_t v, int bits) {
    acc_ |= static_cast<uint64_t>(v) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  void Flush() {
    if (fill_ > 0) *out_++ = static_cast<uint8_t>(acc_);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint32_t Get(int bits) {
    while (fill_ < bits) {
      acc_ |= static_cast<uint64_t>(*in_++) << fill_;
      fill_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((1u << bits) - 1));
    acc_ >>= bits;
    fill_ -= bits;
    return v;
  }
  uint64_t rest() const { return acc_; }

 private:
  const uint8_t* in_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

}  // namespace

float UniformAt(uint64_t seed, uint64_t index) {
  return static_cast<float>(SplitMix64(seed * 0x2545f4914f6cdd1dull ^ SplitMix64(index)) >> 40) * 0x1p-24f;
}

absl::Status SymQuantParams::Validate() const {
  if (bits < 2 || bits > 8) return absl::InvalidArgumentError(absl::StrCat("bits ", bits, " not in 2..8"));
  if (!IsPow2(group_size) || group_size < 8 || group_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("group size ", group_size, " is not a power of two in [8, 65536]"));
  }
  if (hadamard && group_size % kHadamardBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("group size ", group_size, " must be a multiple of 32 with hadamard"));
  }
  if (rounding != Rounding::kNearest && rounding != Rounding::kStochastic) {
    return absl::InvalidArgumentError("unknown rounding mode");
  }
  return absl::OkStatus();
}

std::array<uint8_t, 16> SymQuantParams::Serialize() const {
  std::array<uint8_t, 16> r{};
  r[0] = static_cast<uint8_t>(bits);
  r[1] = hadamard ? 1 : 0;
  r[2] = static_cast<uint8_t>(rounding);
  const uint32_t g = static_cast<uint32_t>(group_size);
  std::memcpy(&r[4], &g, 4);
  return r;
}

absl::StatusOr<SymQuantParams> SymQuantParams::Parse(const std::array<uint8_t, 16>& r) {
  SymQuantParams p;
  p.bits = r[0];
  if (r[1] > 1) return absl::InvalidArgumentError("symmetric-quant frame: bad hadamard flag");
  p.hadamard = r[1] == 1;
  if (r[2] > 1) return absl::InvalidArgumentError("symmetric-quant frame: bad rounding mode");
  p.rounding = static_cast<Rounding>(r[2]);
  uint32_t g;
  std::memcpy(&g, &r[4], 4);
  if (g > 65536) return absl::InvalidArgumentError(absl::StrCat("symmetric-quant frame: group size ", g));
  p.group_size = static_cast<int>(g);
  for (int i : {3, 8, 9, 10, 11, 12, 13, 14, 15}) {
    if (r[i] != 0) return absl::InvalidArgumentError("symmetric-quant frame: non-zero reserved parameter bytes");
  }
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("symmetric-quant frame: ", s.message()));
  }
  return p;
}

uint64_t SymQuantPayloadBytes(int64_t n, const SymQuantParams& p) {
  return static_cast<uint64_t>(NumGroups(n, p.group_size)) * 4 + (static_cast<uint64_t>(n) * p.bits + 7) / 8;
}

void SymQuantEncode(const float* x, int64_t n, const SymQuantParams& p, uint64_t seed, std::string* out,
                    int64_t index_offset) {
  const int64_t ng = NumGroups(n, p.group_size);
  const size_t base = out->size();
  out->resize(base + SymQuantPayloadBytes(n, p));
  uint8_t* scales = reinterpret_cast<uint8_t*>(&(*out)[base]);
  BitWriter w(scales + 4 * ng);
  const int qmax = (1 << (p.bits - 1)) - 1;
  std::vector<float> buf(static_cast<size_t>(p.group_size));
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t start = g * p.group_size;
    const int64_t len = std::min<int64_t>(p.group_size, n - start);
    // One pass per group: load, transform in cache, find the scale, quantise, pack.
    std::memcpy(buf.data(), x + start, static_cast<size_t>(len) * sizeof(float));
    if (p.hadamard) TransformGroup(buf.data(), len);
    float s = 0;
    for (int64_t i = 0; i < len; ++i) s = std::max(s, std::fabs(buf[i]));
    if (!std::isfinite(s)) s = 0;  // non-finite input quantises to zero rather than poisoning the frame
    std::memcpy(scales + 4 * g, &s, 4);
    const float inv = s > 0 ? qmax / s : 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      const float y = buf[i] * inv;
      float r = p.rounding == Rounding::kNearest
                    ? std::nearbyint(y)
                    : std::floor(y + UniformAt(seed, static_cast<uint64_t>(index_offset + start + i)));
      if (std::isnan(r)) r = 0;  // NaN inputs (and anything times a zeroed scale) encode as 0
      r = std::max<float>(-qmax, std::min<float>(qmax, r));
      w.Put(static_cast<uint32_t>(static_cast<int>(r) + qmax), p.bits);
    }
  }
  w.Flush();
}

absl::Status SymQuantValidate(absl::string_view payload, int64_t n, const SymQuantParams& p) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  if (n < 0) return absl::InvalidArgumentError("negative element count");
  const uint64_t want = SymQuantPayloadBytes(n, p);
  if (payload.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("symmetric-quant payload is ", payload.size(), " bytes, ", n, " elements need ", want));
  }
  const int64_t ng = NumGroups(n, p.group_size);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(payload.data());
  for (int64_t g = 0; g < ng; ++g) {
    float s;
    std::memcpy(&s, b + 4 * g, 4);
    if (!std::isfinite(s) || s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("symmetric-quant group ", g, " has scale ", s));
    }
  }
  const uint32_t bad = (1u << p.bits) - 1;
  BitReader r(b + 4 * ng);
  for (int64_t i = 0; i < n; ++i) {
    if (r.Get(p.bits) == bad) {
      return absl::InvalidArgumentError(absl::StrCat("symmetric-quant code of element ", i, " is out of range"));
    }
  }
  if (r.rest() != 0) return absl::InvalidArgumentError("symmetric-quant padding bits are not zero");
  return absl::OkStatus();
}

void SymQuantDecode(absl::string_view payload, int64_t n, const SymQuantParams& p, const SymDecodeOptions& o,
                    float* out) {
  const int64_t ng = NumGroups(n, p.group_size);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(payload.data());
  BitReader r(b + 4 * ng);
  const int qmax = (1 << (p.bits - 1)) - 1;
  std::vector<float> buf(static_cast<size_t>(p.group_size));
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t start = g * p.group_size;
    const int64_t len = std::min<int64_t>(p.group_size, n - start);
    float s;
    std::memcpy(&s, b + 4 * g, 4);
    const float step = s / qmax;
    for (int64_t i = 0; i < len; ++i) buf[i] = static_cast<float>(static_cast<int>(r.Get(p.bits)) - qmax) * step;
    if (p.hadamard && !o.hadamard_domain) TransformGroup(buf.data(), len);
    float* dst = out + start;
    if (o.accumulate) {
      for (int64_t i = 0; i < len; ++i) dst[i] += buf[i];
    } else {
      std::memcpy(dst, buf.data(), static_cast<size_t>(len) * sizeof(float));
    }
  }
}

void Hadamard32(float* x, int64_t n) {
  for (int64_t b = 0; b + kHadamardBlock <= n; b += kHadamardBlock) Fwht32(x + b);
}

}  // namespace longhaul::codec
