#include "codec/sdp4bit.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace longhaul::codec {

std::string QwdEncodeShard(const float* main, const float* model, int64_t n, const SymQuantParams& p,
                           int64_t index_offset) {
  std::vector<float> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[i] = main[i] - model[i];
  std::string out;
  SymQuantEncode(d.data(), n, p, /*seed=*/0, &out, index_offset);
  return out;
}

absl::Status QwdApplyShard(absl::string_view payload, int64_t n, float* model, const SymQuantParams& p) {
  if (absl::Status s = SymQuantValidate(payload, n, p); !s.ok()) return s;
  SymQuantDecode(payload, n, p, {/*accumulate=*/true, /*hadamard_domain=*/false}, model);
  return absl::OkStatus();
}

void QwdSync(const float* main, float* model, int64_t n, const SymQuantParams& p) {
  const std::string d = QwdEncodeShard(main, model, n, p);
  SymQuantDecode(d, n, p, {true, false}, model);
}

void ApplyWeightQuantisation(const std::vector<float>& main, std::vector<float>* model, const Compressor& c) {
  *model = c(main);
}

void ApplyWeightDifference(const std::vector<float>& main, std::vector<float>* model, const Compressor& c) {
  std::vector<float> d(main.size());
  for (size_t i = 0; i < main.size(); ++i) d[i] = main[i] - (*model)[i];
  const std::vector<float> q = c(d);
  for (size_t i = 0; i < main.size(); ++i) (*model)[i] += q[i];
}

std::string QuantiseFast(const float* slice, int64_t n, const TwoLevelConfig& c, uint64_t seed, int64_t off) {
  std::string out;
  SymQuantEncode(slice, n, c.Fast(), seed, &out, off);
  return out;
}

std::string QuantiseSlow(const float* partial, int64_t n, const TwoLevelConfig& c, uint64_t seed, int64_t off) {
  std::string out;
  SymQuantEncode(partial, n, c.Slow(), seed, &out, off);
  return out;
}

absl::Status AccumulateFast(absl::string_view payload, int64_t n, const TwoLevelConfig& c, float* acc) {
  if (absl::Status s = SymQuantValidate(payload, n, c.Fast()); !s.ok()) return s;
  SymQuantDecode(payload, n, c.Fast(), {/*accumulate=*/true, /*hadamard_domain=*/true}, acc);
  return absl::OkStatus();
}

absl::Status AccumulateSlow(absl::string_view payload, int64_t n, const TwoLevelConfig& c, float* acc) {
  if (absl::Status s = SymQuantValidate(payload, n, c.Slow()); !s.ok()) return s;
  SymQuantDecode(payload, n, c.Slow(), {true, true}, acc);
  return absl::OkStatus();
}

void FinishShard(float* shard, int64_t n, const TwoLevelConfig& c) {
  if (c.hadamard) Hadamard32(shard, n);
}

std::vector<int> QgzChunkOrder(int per_region, int regions) {
  std::vector<int> order;
  for (int x = 0; x < per_region; ++x) {
    for (int y = 0; y < regions; ++y) order.push_back(y * per_region + x);
  }
  return order;
}

absl::StatusOr<std::vector<float>> SimulateTwoLevelReduce(const std::vector<std::vector<float>>& grads, int regions,
                                                          const TwoLevelConfig& c, uint64_t seed,
                                                          std::vector<int>* owner) {
  const int P = static_cast<int>(grads.size());
  if (P < 1 || regions < 1 || P % regions != 0) {
    return absl::InvalidArgumentError(absl::StrCat(P, " replicas cannot form ", regions, " equal regions"));
  }
  const int64_t n = static_cast<int64_t>(grads[0].size());
  for (const auto& g : grads) {
    if (static_cast<int64_t>(g.size()) != n) return absl::InvalidArgumentError("replica gradients differ in size");
  }
  const int X = P / regions, Y = regions;
  // Chunks are whole groups (so Hadamard blocks and groups align with the tensor's); pad with zeros.
  const int64_t chunk = (n + int64_t{P} * c.group_size - 1) / (int64_t{P} * c.group_size) * c.group_size;
  const int64_t padded = chunk * P;
  auto chunk_of = [&](int r, int k) { return grads[r].data() + std::min<int64_t>(k * chunk, n); };
  auto chunk_len = [&](int k) { return std::max<int64_t>(0, std::min<int64_t>(chunk, n - k * chunk)); };

  // Level 1 (inside each region): rank (y, x') sends local rank x the slice of chunks
  // {y'X + x : y' = 0..Y-1}; the receiver accumulates in the Hadamard domain.
  const std::vector<int> order = QgzChunkOrder(X, Y);
  std::vector<std::vector<float>> level1(P, std::vector<float>(static_cast<size_t>(Y * chunk), 0.0f));
  std::vector<float> slice(static_cast<size_t>(Y * chunk));
  for (int r = 0; r < P; ++r) {
    const int y = r / X;
    for (int x = 0; x < X; ++x) {
      std::fill(slice.begin(), slice.end(), 0.0f);
      for (int yy = 0; yy < Y; ++yy) {
        const int k = order[x * Y + yy];  // = yy * X + x
        std::memcpy(slice.data() + yy * chunk, chunk_of(r, k), static_cast<size_t>(chunk_len(k)) * sizeof(float));
      }
      // Each element's stochastic draw is keyed by (sender, element), so runs are reproducible.
      const std::string msg = QuantiseFast(slice.data(), Y * chunk, c, seed * 1000003 + r, 0);
      absl::Status s = AccumulateFast(msg, Y * chunk, c, level1[y * X + x].data());
      if (!s.ok()) return s;
    }
  }
  // Level 2 (across regions, between ranks with the same local index): rank (y, x) sends region
  // y' the part of its partial sum that is chunk y'X + x.
  std::vector<std::vector<float>> shard(P, std::vector<float>(static_cast<size_t>(chunk), 0.0f));
  for (int r = 0; r < P; ++r) {
    const int x = r % X;
    for (int yy = 0; yy < Y; ++yy) {
      const std::string msg = QuantiseSlow(level1[r].data() + yy * chunk, chunk, c, seed * 1000003 + P + r, 0);
      absl::Status s = AccumulateSlow(msg, chunk, c, shard[yy * X + x].data());
      if (!s.ok()) return s;
    }
  }
  std::vector<float> out(static_cast<size_t>(padded));
  for (int k = 0; k < P; ++k) {
    FinishShard(shard[k].data(), chunk, c);
    std::memcpy(out.data() + k * chunk, shard[k].data(), static_cast<size_t>(chunk) * sizeof(float));
  }
  out.resize(static_cast<size_t>(n));
  if (owner) {
    owner->assign(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) (*owner)[i] = static_cast<int>(i / chunk);
  }
  return out;
}

}  // namespace longhaul::codec
