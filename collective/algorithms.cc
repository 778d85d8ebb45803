#include "collective/algorithms.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/sym_quant.h"

namespace longhaul::collective {

namespace {

int RingPosition(const Topology& topo, int rank) {
  const std::vector<int>& ring = topo.ring();
  return static_cast<int>(std::find(ring.begin(), ring.end(), rank) - ring.begin());
}

absl::string_view Bytes(const float* p, int64_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n) * sizeof(float));
}

absl::Status BadPayload(const Op& op, int peer, absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(op.PeerName(peer), " sent a bad ", what, ": ", s.message()));
}

// Distinct stochastic-rounding streams per (level, sender, receiver) of one call.
uint64_t StreamSeed(uint64_t seed, int level, int from, int to, int size) {
  return seed * 1000003ull + static_cast<uint64_t>((level * size + from) * size + to);
}

}  // namespace

std::vector<int> CarriedShards(const Topology& topo, int y, int m) {
  std::vector<int> out;
  for (int k = 0; k < topo.size(); ++k) {
    if (topo.Partner(y, k) == m) out.push_back(k);
  }
  return out;
}

std::vector<int> ForwardedBlobs(const Topology& topo, int r) {
  std::vector<int> out;
  const int y = topo.region(r);
  for (int k = 0; k < topo.size(); ++k) {
    if (k == r || (topo.region(k) != y && topo.Partner(y, k) == r)) out.push_back(k);
  }
  return out;
}

absl::Status RingReduceScatter(Op& op, const Topology& topo, const ShardLayout& layout, float* padded) {
  const int P = topo.size();
  op.NextPhase();
  if (P == 1) return absl::OkStatus();
  const std::vector<int>& ring = topo.ring();
  const int p = RingPosition(topo, op.rank());
  const int next = ring[(p + 1) % P], prev = ring[(p + P - 1) % P];
  const int64_t c = layout.chunk;
  std::vector<float> in(static_cast<size_t>(c));
  // Step s: position p passes on its partial sum of shard ring[p - s - 1] and adds its own values
  // to the partial of shard ring[p - s - 2] from its predecessor. Shard ring[q]'s sum therefore
  // starts at position q + 1 and ends, after P - 1 steps, at its owner q.
  for (int s = 0; s < P - 1; ++s) {
    const int send_shard = ring[(p - s - 1 + 2 * P) % P];
    const int recv_shard = ring[(p - s - 2 + 2 * P) % P];
    if (absl::Status st = op.Send(next, s, Bytes(padded + send_shard * c, c), c * 4); !st.ok()) return st;
    absl::StatusOr<std::string> m = op.Recv(prev, s, c * 4);
    if (!m.ok()) return m.status();
    std::memcpy(in.data(), m->data(), m->size());
    float* dst = padded + recv_shard * c;
    for (int64_t i = 0; i < c; ++i) dst[i] = in[i] + dst[i];
  }
  return absl::OkStatus();
}

absl::Status RingAllGather(Op& op, const Topology& topo, const ShardLayout& layout, float* padded) {
  const int P = topo.size();
  op.NextPhase();
  if (P == 1) return absl::OkStatus();
  const std::vector<int>& ring = topo.ring();
  const int p = RingPosition(topo, op.rank());
  const int next = ring[(p + 1) % P], prev = ring[(p + P - 1) % P];
  const int64_t c = layout.chunk;
  for (int s = 0; s < P - 1; ++s) {
    const int send_shard = ring[(p - s + P) % P];
    const int recv_shard = ring[(p - s - 1 + P) % P];
    if (absl::Status st = op.Send(next, s, Bytes(padded + send_shard * c, c), c * 4); !st.ok()) return st;
    absl::StatusOr<std::string> m = op.Recv(prev, s, c * 4);
    if (!m.ok()) return m.status();
    std::memcpy(padded + recv_shard * c, m->data(), m->size());
  }
  return absl::OkStatus();
}

absl::Status TwoLevelAllGather(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                               const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes) {
  const int P = topo.size(), me = op.rank(), y = topo.region(me);
  std::vector<std::string>& b = *blobs;
  // Across regions: this rank's blob to its partner in every other region.
  op.NextPhase();
  for (int yy = 0; yy < topo.num_regions(); ++yy) {
    if (yy == y) continue;
    if (absl::Status s = op.Send(topo.Partner(yy, me), me, b[me], raw_bytes[me]); !s.ok()) return s;
  }
  for (int k = 0; k < P; ++k) {
    if (topo.region(k) == y || topo.Partner(y, k) != me) continue;
    absl::StatusOr<std::string> m = op.Recv(k, k, expected_bytes[k]);
    if (!m.ok()) return m.status();
    b[k] = *std::move(m);
  }
  // Inside the region: own blob and the forwarded ones to every other member.
  op.NextPhase();
  const std::vector<int>& members = topo.members(y);
  const std::vector<int> mine = ForwardedBlobs(topo, me);
  for (int m : members) {
    if (m == me) continue;
    for (int k : mine) {
      if (absl::Status s = op.Send(m, k, b[k], raw_bytes[k]); !s.ok()) return s;
    }
  }
  for (int m : members) {
    if (m == me) continue;
    for (int k : ForwardedBlobs(topo, m)) {
      absl::StatusOr<std::string> r = op.Recv(m, k, expected_bytes[k]);
      if (!r.ok()) return r.status();
      b[k] = *std::move(r);
    }
  }
  return absl::OkStatus();
}

absl::Status TwoLevelReduceScatter(Op& op, const Topology& topo, const ShardLayout& layout, const float* padded,
                                   const codec::TwoLevelConfig& c, uint64_t seed, float* shard_sum) {
  const int P = topo.size(), me = op.rank(), y = topo.region(me);
  const int64_t len = layout.chunk;
  const std::vector<int>& members = topo.members(y);
  // Level 1, inside the region.
  op.NextPhase();
  std::vector<float> slice;
  auto gather = [&](const std::vector<int>& shards) {
    slice.resize(shards.size() * static_cast<size_t>(len));
    for (size_t i = 0; i < shards.size(); ++i) {
      std::memcpy(slice.data() + i * len, padded + shards[i] * len, static_cast<size_t>(len) * sizeof(float));
    }
  };
  for (int m : members) {
    if (m == me) continue;
    const std::vector<int> shards = CarriedShards(topo, y, m);
    gather(shards);
    const int64_t n = static_cast<int64_t>(slice.size());
    const std::string q = codec::QuantiseFast(slice.data(), n, c, StreamSeed(seed, 0, me, m, P));
    if (absl::Status s = op.Send(m, 0, q, n * 4); !s.ok()) return s;
  }
  const std::vector<int> carried = CarriedShards(topo, y, me);
  const int64_t n1 = static_cast<int64_t>(carried.size()) * len;
  std::vector<float> acc(static_cast<size_t>(n1), 0.0f);
  for (int m : members) {
    if (m == me) {
      // This rank's own contribution does not cross a wire: transformed, not quantised.
      gather(carried);
      if (c.hadamard) codec::Hadamard32(slice.data(), n1);
      for (int64_t i = 0; i < n1; ++i) acc[i] += slice[i];
      continue;
    }
    absl::StatusOr<std::string> q = op.Recv(m, 0, static_cast<int64_t>(codec::SymQuantPayloadBytes(n1, c.Fast())));
    if (!q.ok()) return q.status();
    if (absl::Status s = codec::AccumulateFast(*q, n1, c, acc.data()); !s.ok()) {
      return BadPayload(op, m, "level-1 gradient payload", s);
    }
  }
  // Level 2, across regions: each carried partial to its shard's owner.
  op.NextPhase();
  int own_index = -1;
  for (size_t i = 0; i < carried.size(); ++i) {
    const int k = carried[i];
    if (k == me) {
      own_index = static_cast<int>(i);
      continue;
    }
    const std::string q = codec::QuantiseSlow(acc.data() + i * len, len, c, StreamSeed(seed, 1, me, k, P));
    if (absl::Status s = op.Send(k, 0, q, len * 4); !s.ok()) return s;
  }
  std::fill(shard_sum, shard_sum + len, 0.0f);
  for (int yy = 0; yy < topo.num_regions(); ++yy) {
    const int f = topo.Partner(yy, me);
    if (f == me) {
      const float* own = acc.data() + own_index * len;
      for (int64_t i = 0; i < len; ++i) shard_sum[i] += own[i];
      continue;
    }
    absl::StatusOr<std::string> q = op.Recv(f, 0, static_cast<int64_t>(codec::SymQuantPayloadBytes(len, c.Slow())));
    if (!q.ok()) return q.status();
    if (absl::Status s = codec::AccumulateSlow(*q, len, c, shard_sum); !s.ok()) {
      return BadPayload(op, f, "level-2 gradient payload", s);
    }
  }
  codec::FinishShard(shard_sum, len, c);
  return absl::OkStatus();
}

}  // namespace longhaul::collective
