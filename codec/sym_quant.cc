#include "codec/sym_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/int_util.h"

namespace longhaul::codec {
namespace {

int64_t NumGroups(int64_t n, int g) { return (n + g - 1) / g; }

// Transforms the full 32-blocks of a group (groups start at multiples of 32, so these are the
// tensor's own blocks; only the tensor's tail can be shorter than a block).
void TransformGroup(float* v, int64_t len, const Kernels& k) {
  for (int64_t b = 0; b + kHadamardBlock <= len; b += kHadamardBlock) k.fwht(v + b, kHadamardBlock);
}

// Whether any of the n codes of `bits` bits packed at `codes` is all ones (the code symmetric
// quantisation never writes: -2^(bits-1)), 64 bits at a time. `bits` is a power of two, so no
// code straddles a byte. Padding bits after the last code that happen to be all ones also say
// yes: the caller's unpacking then finds no bad code, and its padding check refuses them.
bool AnyAllOnesCode(const uint8_t* codes, int64_t n, int bits) {
  uint64_t lowest = 0;  // the lowest bit of every code of a word
  for (int i = 0; i < 64; i += bits) lowest |= uint64_t{1} << i;
  auto any = [&](uint64_t w) {
    for (int s = 1; s < bits; s *= 2) w &= w >> s;  // bit i: the AND of bits i .. i + 2s - 1
    return (w & lowest) != 0;
  };
  const int64_t bytes = (n * bits + 7) / 8;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, codes + i, 8);
    if (any(w)) return true;
  }
  if (i == bytes) return false;
  uint64_t w = 0;
  std::memcpy(&w, codes + i, static_cast<size_t>(bytes - i));
  return any(w);
}

}  // namespace

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
                    int64_t index_offset, const Kernels& k) {
  const int64_t ng = NumGroups(n, p.group_size);
  const size_t base = out->size();
  out->resize(base + SymQuantPayloadBytes(n, p));
  uint8_t* scales = reinterpret_cast<uint8_t*>(&(*out)[base]);
  uint8_t* codes = scales + 4 * ng;
  const int qmax = (1 << (p.bits - 1)) - 1;
  const float maxq = static_cast<float>(2 * qmax);
  std::vector<float> buf(static_cast<size_t>(p.group_size));
  std::vector<uint8_t> q(static_cast<size_t>(p.group_size));
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t start = g * p.group_size;
    const int len = static_cast<int>(std::min<int64_t>(p.group_size, n - start));
    // One pass per group: load, transform in cache, find the scale, quantise, pack.
    std::memcpy(buf.data(), x + start, static_cast<size_t>(len) * sizeof(float));
    if (p.hadamard) TransformGroup(buf.data(), len, k);
    for (int i = 0; i < len; ++i) {
      if (std::isnan(buf[i])) buf[i] = 0;  // NaN encodes as 0 instead of poisoning the scale
    }
    float sum, s;
    k.abs_sum_max(buf.data(), len, &sum, &s);
    if (!std::isfinite(s)) {  // infinities: the group cannot be represented; send zeros
      s = 0;
      std::fill(buf.begin(), buf.begin() + len, 0.0f);
    }
    std::memcpy(scales + 4 * g, &s, 4);
    const float inv = s > 0 ? static_cast<float>(qmax) / s : 0.0f;
    const float lo = -s;
    if (p.rounding == Rounding::kNearest) {
      k.quantize(buf.data(), len, lo, inv, maxq, q.data());
    } else {
      for (int i = 0; i < len; ++i) {
        const float c = std::floor((buf[i] - lo) * inv + UniformAt(seed, static_cast<uint64_t>(index_offset + start + i)));
        q[i] = static_cast<uint8_t>(std::max(0.0f, std::min(maxq, c)));
      }
    }
    // Groups hold a multiple of 8 codes, so each group's codes start on a byte boundary.
    k.pack(q.data(), len, p.bits, codes + start * p.bits / 8);
  }
}

absl::Status SymQuantValidate(absl::string_view payload, int64_t n, const SymQuantParams& p, const Kernels& k) {
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
  const uint8_t bad = static_cast<uint8_t>((1u << p.bits) - 1);
  const uint8_t* codes = b + 4 * ng;
  // Codes of 2, 4 or 8 bits are tested in place first; unpacking (the other widths, or a payload
  // with a bad code) names the element.
  const bool unpack = !IsPow2(p.bits) || AnyAllOnesCode(codes, n, p.bits);
  std::vector<uint8_t> q(unpack ? static_cast<size_t>(p.group_size) : 0);
  for (int64_t g = 0; unpack && g < ng; ++g) {
    const int64_t start = g * p.group_size;
    const int len = static_cast<int>(std::min<int64_t>(p.group_size, n - start));
    k.unpack(codes + start * p.bits / 8, len, p.bits, q.data());
    for (int i = 0; i < len; ++i) {
      if (q[i] == bad) {
        return absl::InvalidArgumentError(absl::StrCat("symmetric-quant code of element ", start + i, " is out of range"));
      }
    }
  }
  const int64_t used_bits = n * p.bits;
  if (used_bits % 8 != 0 && (payload.back() >> (used_bits % 8)) != 0) {
    return absl::InvalidArgumentError("symmetric-quant padding bits are not zero");
  }
  return absl::OkStatus();
}

void SymQuantDecode(absl::string_view payload, int64_t n, const SymQuantParams& p, const SymDecodeOptions& o,
                    float* out, const Kernels& k) {
  const int64_t ng = NumGroups(n, p.group_size);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(payload.data());
  const uint8_t* codes = b + 4 * ng;
  const int qmax = (1 << (p.bits - 1)) - 1;
  std::vector<float> buf(static_cast<size_t>(p.group_size));
  std::vector<uint8_t> q(static_cast<size_t>(p.group_size));
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t start = g * p.group_size;
    const int len = static_cast<int>(std::min<int64_t>(p.group_size, n - start));
    float s;
    std::memcpy(&s, b + 4 * g, 4);
    k.unpack(codes + start * p.bits / 8, len, p.bits, q.data());
    k.dequantize(q.data(), len, -s, s / static_cast<float>(qmax), buf.data());
    if (p.hadamard && !o.hadamard_domain) TransformGroup(buf.data(), len, k);
    float* dst = out + start;
    if (o.accumulate) {
      for (int i = 0; i < len; ++i) dst[i] += buf[i];
    } else {
      std::memcpy(dst, buf.data(), static_cast<size_t>(len) * sizeof(float));
    }
  }
}

void Hadamard32(float* x, int64_t n) {
  // The unfused reference: the scalar kernel, whatever the CPU.
  TransformGroup(x, n, ScalarKernels());
}

}  // namespace longhaul::codec
