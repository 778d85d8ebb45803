#include "codec/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "codec/int_util.h"
#include "codec/byte_io.h"
#include "codec/cpu/kernels_common.h"
#include "codec/minifloat.h"
#include "codec/parallel.h"

namespace longhaul::codec {
namespace {

constexpr int kMaxGroup = 256;
constexpr uint8_t kFlagAdaptive = 1, kFlagHadamard = 2;

struct TokenStats {
  float entropy;
  int8_t exp;
};

// Quantises one group (already transformed if flagged) against mf12 parameters; returns the
// 24-bit parameter word.
uint32_t QuantizeGroup(const float* v, int n, int exp, int maxq, bool flagged, const Kernels& k,
                       uint8_t* codes) {
  float lo, hi;
  k.min_max(v, n, &lo, &hi);
  const GroupParams g = MakeGroupParams(lo, hi, exp, maxq, flagged);
  k.quantize(v, n, g.lo_q, g.inv_scale, static_cast<float>(maxq), codes);
  return g.word;
}

int NumGroups(int64_t dim, int g) { return static_cast<int>((dim + g - 1) / g); }

}  // namespace

std::array<uint8_t, 16> GroupQuantParams::Serialize() const {
  std::array<uint8_t, 16> r{};
  SetU16(r.data(), static_cast<uint16_t>(group_size));
  r[2] = static_cast<uint8_t>(bits_hi);
  r[3] = static_cast<uint8_t>(bits_lo);
  r[4] = (adaptive ? kFlagAdaptive : 0) | (hadamard ? kFlagHadamard : 0);
  SetF32(r.data() + 8, ratio);
  SetF32(r.data() + 12, tau);
  return r;
}

absl::StatusOr<GroupQuantParams> GroupQuantParams::Parse(const std::array<uint8_t, 16>& r) {
  GroupQuantParams p;
  p.group_size = GetU16(r.data());
  p.bits_hi = r[2];
  p.bits_lo = r[3];
  if ((r[4] & ~(kFlagAdaptive | kFlagHadamard)) != 0 || r[5] != 0 || r[6] != 0 || r[7] != 0) {
    return absl::InvalidArgumentError("grouped-quant parameters: unknown flag or reserved bits set");
  }
  p.adaptive = r[4] & kFlagAdaptive;
  p.hadamard = r[4] & kFlagHadamard;
  p.ratio = GetF32(r.data() + 8);
  p.tau = GetF32(r.data() + 12);
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  return p;
}

absl::Status GroupQuantParams::Validate() const {
  if (!IsPow2(group_size) || group_size < 8 || group_size > kMaxGroup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", group_size, " is not a power of two in [8, ", kMaxGroup, "]"));
  }
  if (bits_hi < 2 || bits_hi > 8 || bits_lo < 2 || bits_lo > bits_hi) {
    return absl::InvalidArgumentError(absl::StrCat("bit widths ", bits_hi, "/", bits_lo,
                                                   " out of range (need 2 <= lo <= hi <= 8)"));
  }
  if (!(ratio >= 0.0f && ratio <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("ratio ", ratio, " is not in [0, 1]"));
  }
  if (!(tau > 0.0f) || !std::isfinite(tau)) {
    return absl::InvalidArgumentError(absl::StrCat("tau ", tau, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

absl::Status GroupQuantEncode(const float* x, int64_t tokens, int64_t dim,
                              const GroupQuantParams& p, int threads, const Kernels& k,
                              std::string* payload, GroupQuantStats* stats) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  if (tokens == 0 || dim == 0) return absl::OkStatus();
  const int g = p.group_size;
  const int ng = NumGroups(dim, g);
  const bool two_widths = p.bits_hi != p.bits_lo;

  // Phase 1 (parallel): per-token entropy and exponent; reject non-finite and huge inputs.
  std::vector<TokenStats> ts(tokens);
  const int nchunks = NumChunks(tokens, threads);
  std::vector<int64_t> bad(nchunks, -1);  // first rejected token of each chunk
  std::vector<int> bad_kind(nchunks, 0);
  const bool adaptive = two_widths && p.adaptive;
  ParallelFor(tokens, threads, [&](int chunk, int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* row = x + t * dim;
      TokenSums sums;
      k.token_sums(row, dim, adaptive, &sums);
      const float sum = sums.sum, mx = sums.max;
      if (!std::isfinite(sum) || mx > 0x1p100f) {
        bad[chunk] = t;
        bad_kind[chunk] = std::isfinite(sum) ? 2 : 1;
        return;
      }
      int e2 = 0;
      if (mx > 0.0f) std::frexp(mx, &e2);
      ts[t].exp = static_cast<int8_t>(std::clamp(e2 + 4, kMinTokenExp, kMaxTokenExp));
      ts[t].entropy = adaptive ? TokenEntropy(sum, sums.alog) : 0.0f;
    }
  });
  for (int i = 0; i < nchunks; ++i) {
    if (bad[i] >= 0) {
      return absl::InvalidArgumentError(
          bad_kind[i] == 1
              ? absl::StrCat("input has a NaN or Inf in token ", bad[i])
              : absl::StrCat("input magnitude above 2^100 in token ", bad[i],
                             " (use the fp32 codec for such tensors)"));
    }
  }

  // Phase 2: bit allocation. The top `ratio` tokens (by entropy, or by a fixed hash without
  // adaptive allocation) get bits_hi; ties broken by token index so encoding is deterministic.
  std::vector<uint8_t> bits(tokens, static_cast<uint8_t>(p.bits_hi));
  int64_t n_hi = tokens;
  if (two_widths) {
    n_hi = std::llround(static_cast<double>(p.ratio) * static_cast<double>(tokens));
    std::vector<int64_t> order(tokens);
    std::iota(order.begin(), order.end(), 0);
    auto by_entropy = [&](int64_t a, int64_t b) {
      return ts[a].entropy != ts[b].entropy ? ts[a].entropy > ts[b].entropy : a < b;
    };
    auto by_hash = [](int64_t a, int64_t b) {
      const uint64_t ha = SplitMix64(a), hb = SplitMix64(b);
      return ha != hb ? ha < hb : a < b;
    };
    if (n_hi < tokens) {
      if (p.adaptive) {
        std::nth_element(order.begin(), order.begin() + n_hi, order.end(), by_entropy);
      } else {
        std::nth_element(order.begin(), order.begin() + n_hi, order.end(), by_hash);
      }
      for (int64_t i = n_hi; i < tokens; ++i) bits[order[i]] = static_cast<uint8_t>(p.bits_lo);
    }
  }

  // Phase 3 (parallel): token blocks into one buffer per thread, then concatenated.
  // One chunk writes straight into *payload; several write their own parts, appended in order.
  std::vector<std::string> parts(nchunks > 1 ? nchunks : 0);
  std::vector<int64_t> part_transformed(nchunks, 0);
  ParallelFor(tokens, threads, [&](int chunk, int64_t b, int64_t e) {
    std::string& out = nchunks > 1 ? parts[chunk] : *payload;
    // Upper bound of this chunk's blocks (every group transformed), so appends never reallocate.
    out.reserve(out.size() + static_cast<size_t>(e - b) *
                (2 + 4 * static_cast<size_t>(ng) + PackedBytes(dim, p.bits_hi)));
    std::vector<uint8_t> codes(dim), packed(PackedBytes(dim, 8));
    std::vector<uint8_t> params(3 * static_cast<size_t>(ng));
    std::vector<uint8_t> pivots;
    alignas(32) float tmp[kMaxGroup];
    int64_t transformed = 0;
    for (int64_t t = b; t < e; ++t) {
      const float* row = x + t * dim;
      const int exp = ts[t].exp;
      const int maxq = (1 << bits[t]) - 1;
      pivots.clear();
      for (int gi = 0; gi < ng; ++gi) {
        const int64_t off = static_cast<int64_t>(gi) * g;
        const int n = static_cast<int>(std::min<int64_t>(g, dim - off));
        const float* v = row + off;
        bool flagged = false;
        if (p.hadamard && n == g) {
          float a1, a2;
          k.top2_abs(v, n, &a1, &a2);
          if (IsOutlierGroup(a1, a2, p.tau)) {
            int piv = 0;
            while (std::fabs(v[piv]) != a1) ++piv;
            std::memcpy(tmp, v, sizeof(float) * n);
            std::swap(tmp[0], tmp[piv]);
            k.fwht(tmp, n);
            v = tmp;
            flagged = true;
            pivots.push_back(static_cast<uint8_t>(piv));
            ++transformed;
          }
        }
        const uint32_t w = QuantizeGroup(v, n, exp, maxq, flagged, k, codes.data() + off);
        params[3 * gi] = w & 0xFF;
        params[3 * gi + 1] = (w >> 8) & 0xFF;
        params[3 * gi + 2] = (w >> 16) & 0xFF;
      }
      const int64_t nbytes = PackedBytes(dim, bits[t]);
      k.pack(codes.data(), dim, bits[t], packed.data());
      out.push_back(static_cast<char>(bits[t]));
      out.push_back(static_cast<char>(exp));
      out.append(reinterpret_cast<const char*>(params.data()), params.size());
      out.append(reinterpret_cast<const char*>(pivots.data()), pivots.size());
      out.append(reinterpret_cast<const char*>(packed.data()), nbytes);
    }
    part_transformed[chunk] = transformed;
  });
  size_t total = payload->size();
  for (const auto& s : parts) total += s.size();
  payload->reserve(total);
  for (const auto& s : parts) payload->append(s);
  if (stats != nullptr) {
    stats->groups = tokens * ng;
    stats->transformed_groups = std::accumulate(part_transformed.begin(), part_transformed.end(), int64_t{0});
    stats->tokens_hi = n_hi;
  }
  return absl::OkStatus();
}

absl::StatusOr<GroupQuantLayout> GroupQuantValidate(absl::string_view payload, int64_t tokens,
                                                    int64_t dim, const GroupQuantParams& p) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  if (tokens == 0 || dim == 0) {
    if (!payload.empty()) return absl::InvalidArgumentError("payload not empty for an empty tensor");
    return GroupQuantLayout{{0}};
  }
  const int g = p.group_size;
  const int ng = NumGroups(dim, g);
  // Cheapest possible block, checked before allocating the offset table.
  const uint64_t min_block = 2 + 3 * static_cast<uint64_t>(ng) + PackedBytes(dim, p.bits_lo);
  if (static_cast<uint64_t>(tokens) > payload.size() / min_block) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload of ", payload.size(), " bytes is too short for ", tokens, " tokens of ", dim,
        " channels (at least ", min_block, " bytes each)"));
  }
  GroupQuantLayout layout;
  layout.token_offset.resize(tokens + 1);
  const auto* base = reinterpret_cast<const uint8_t*>(payload.data());
  const uint64_t size = payload.size();
  uint64_t off = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    layout.token_offset[t] = off;
    if (size - off < 2 + 3 * static_cast<uint64_t>(ng)) {
      return absl::InvalidArgumentError(absl::StrCat("payload truncated in token ", t));
    }
    const int bits = base[off];
    const int exp = static_cast<int8_t>(base[off + 1]);
    if (bits != p.bits_hi && bits != p.bits_lo) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " has bit width ", bits,
                                                     ", the frame allows ", p.bits_hi, " or ",
                                                     p.bits_lo));
    }
    if (exp < kMinTokenExp || exp > kMaxTokenExp) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " has scale exponent ", exp,
                                                     " outside [", kMinTokenExp, ", ",
                                                     kMaxTokenExp, "] (corrupt scale)"));
    }
    off += 2;
    int flagged = 0;
    for (int gi = 0; gi < ng; ++gi) {
      if (base[off + 3 * gi + 2] & 0x80) {
        if (!p.hadamard) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token ", t, " group ", gi, " is marked transformed but the frame disables Hadamard"));
        }
        if (static_cast<int64_t>(gi + 1) * g > dim) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token ", t, " group ", gi, " is partial and cannot be transformed"));
        }
        ++flagged;
      }
    }
    off += 3 * static_cast<uint64_t>(ng);
    if (size - off < static_cast<uint64_t>(flagged)) {
      return absl::InvalidArgumentError(absl::StrCat("payload truncated in token ", t, " pivots"));
    }
    for (int i = 0; i < flagged; ++i) {
      if (base[off + i] >= g) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, " has pivot index ",
                                                       base[off + i], ", group size is ", g));
      }
    }
    off += flagged;
    const uint64_t code_bytes = PackedBytes(dim, bits);
    if (size - off < code_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("payload truncated in token ", t, " codes"));
    }
    off += code_bytes;
  }
  if (off != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload has ", size - off, " trailing bytes after the last token"));
  }
  layout.token_offset[tokens] = off;
  return layout;
}

void GroupQuantDecode(absl::string_view payload, const GroupQuantLayout& layout, int64_t tokens,
                      int64_t dim, const GroupQuantParams& p, int threads, const Kernels& k,
                      float* out) {
  const int g = p.group_size;
  const int ng = NumGroups(dim, g);
  const auto* base = reinterpret_cast<const uint8_t*>(payload.data());
  ParallelFor(tokens, threads, [&](int, int64_t b, int64_t e) {
    std::vector<uint8_t> codes(dim);
    for (int64_t t = b; t < e; ++t) {
      const uint8_t* blk = base + layout.token_offset[t];
      const int bits = blk[0];
      const int exp = static_cast<int8_t>(blk[1]);
      const float from_rel = Pow2(exp);
      const uint8_t* params = blk + 2;
      int flagged = 0;
      for (int gi = 0; gi < ng; ++gi) flagged += (params[3 * gi + 2] >> 7);
      const uint8_t* pivots = params + 3 * ng;
      k.unpack(pivots + flagged, dim, bits, codes.data());
      float* row = out + t * dim;
      int next_pivot = 0;
      for (int gi = 0; gi < ng; ++gi) {
        const uint32_t w = params[3 * gi] | (params[3 * gi + 1] << 8) |
                           (static_cast<uint32_t>(params[3 * gi + 2]) << 16);
        const float lo = Mf12Decode(w & 0xFFF) * from_rel;
        const float scale = Mf12Decode((w >> 12) & 0x7FF) * from_rel;
        const int64_t off = static_cast<int64_t>(gi) * g;
        const int n = static_cast<int>(std::min<int64_t>(g, dim - off));
        k.dequantize(codes.data() + off, n, lo, scale, row + off);
        if (w & (1u << 23)) {
          k.fwht(row + off, n);
          std::swap(row[off], row[off + pivots[next_pivot++]]);
        }
      }
    }
  });
}

}  // namespace longhaul::codec
