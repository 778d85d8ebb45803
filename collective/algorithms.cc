#include "collective/algorithms.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

absl::Status AllGatherAcrossRegions(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                                    const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes) {
  const int P = topo.size(), me = op.rank(), y = topo.region(me);
  std::vector<std::string>& b = *blobs;
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
  return absl::OkStatus();
}

absl::Status AllGatherInsideRegion(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                                   const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes) {
  const int me = op.rank(), y = topo.region(me);
  std::vector<std::string>& b = *blobs;
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

absl::Status TwoLevelAllGather(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                               const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes) {
  absl::Status s = AllGatherAcrossRegions(op, topo, blobs, expected_bytes, raw_bytes);
  return s.ok() ? AllGatherInsideRegion(op, topo, blobs, expected_bytes, raw_bytes) : s;
}

namespace {

// Elements [begin, begin + length) of every shard's chunk: a bucket of the two-level
// reduce-scatter.
struct Bucket {
  int64_t begin, length;
};

// Level 1 of one bucket, inside the region: this rank sends member m the bucket's part of each
// shard m carries (CarriedShards), each part quantised on its own at c.fast_bits with the draws of
// its elements' places in the unbucketed slice (so the pieces' payloads, concatenated, decode to
// what the whole slice's would), and sums what it carries in the Hadamard domain, in member order,
// into acc (carried shard i at acc + i * len).
absl::Status ReduceInsideRegion(Op& op, const Topology& topo, int64_t len, const float* padded,
                                const codec::TwoLevelConfig& c, uint64_t seed, Bucket b, float* acc) {
  const int P = topo.size(), me = op.rank(), y = topo.region(me);
  op.NextPhase();
  const std::vector<int>& members = topo.members(y);
  for (int m : members) {
    if (m == me) continue;
    const std::vector<int> shards = CarriedShards(topo, y, m);
    std::string q;
    for (size_t i = 0; i < shards.size(); ++i) {
      q += codec::QuantiseFast(padded + shards[i] * len + b.begin, b.length, c, StreamSeed(seed, 0, me, m, P),
                               static_cast<int64_t>(i) * len + b.begin);
    }
    if (absl::Status s = op.Send(m, 0, q, static_cast<int64_t>(shards.size()) * b.length * 4); !s.ok()) return s;
  }
  const std::vector<int> carried = CarriedShards(topo, y, me);
  const size_t piece = static_cast<size_t>(codec::SymQuantPayloadBytes(b.length, c.Fast()));
  for (size_t i = 0; i < carried.size(); ++i) std::fill_n(acc + i * len + b.begin, b.length, 0.0f);
  std::vector<float> own(static_cast<size_t>(b.length));
  for (int m : members) {
    if (m == me) {
      // This rank's own contribution does not cross a wire: transformed, not quantised.
      for (size_t i = 0; i < carried.size(); ++i) {
        std::copy_n(padded + carried[i] * len + b.begin, b.length, own.data());
        if (c.hadamard) codec::Hadamard32(own.data(), b.length);
        float* dst = acc + i * len + b.begin;
        for (int64_t j = 0; j < b.length; ++j) dst[j] += own[j];
      }
      continue;
    }
    absl::StatusOr<std::string> q = op.Recv(m, 0, static_cast<int64_t>(carried.size() * piece));
    if (!q.ok()) return q.status();
    for (size_t i = 0; i < carried.size(); ++i) {
      if (absl::Status s = codec::AccumulateFast(absl::string_view(*q).substr(i * piece, piece), b.length, c,
                                                 acc + i * len + b.begin);
          !s.ok()) {
        return BadPayload(op, m, "level-1 gradient payload", s);
      }
    }
  }
  return absl::OkStatus();
}

// Level 2 of one bucket, across regions: each carried partial's part (acc, as ReduceInsideRegion
// left it) to its shard's owner at c.slow_bits; this rank sums the regions' parts of its own shard
// in region order into shard_sum[b.begin, b.begin + b.length) and transforms them back.
absl::Status ReduceAcrossRegions(Op& op, const Topology& topo, int64_t len, const float* acc,
                                 const codec::TwoLevelConfig& c, uint64_t seed, Bucket b, float* shard_sum) {
  const int P = topo.size(), me = op.rank(), y = topo.region(me);
  op.NextPhase();
  const std::vector<int> carried = CarriedShards(topo, y, me);
  int own_index = -1;
  for (size_t i = 0; i < carried.size(); ++i) {
    const int k = carried[i];
    if (k == me) {
      own_index = static_cast<int>(i);
      continue;
    }
    const std::string q = codec::QuantiseSlow(acc + i * len + b.begin, b.length, c, StreamSeed(seed, 1, me, k, P), b.begin);
    if (absl::Status s = op.Send(k, 0, q, b.length * 4); !s.ok()) return s;
  }
  float* sum = shard_sum + b.begin;
  std::fill_n(sum, b.length, 0.0f);
  for (int yy = 0; yy < topo.num_regions(); ++yy) {
    const int f = topo.Partner(yy, me);
    if (f == me) {
      const float* own = acc + own_index * len + b.begin;
      for (int64_t i = 0; i < b.length; ++i) sum[i] += own[i];
      continue;
    }
    absl::StatusOr<std::string> q =
        op.Recv(f, 0, static_cast<int64_t>(codec::SymQuantPayloadBytes(b.length, c.Slow())));
    if (!q.ok()) return q.status();
    if (absl::Status s = codec::AccumulateSlow(*q, b.length, c, sum); !s.ok()) {
      return BadPayload(op, f, "level-2 gradient payload", s);
    }
  }
  codec::FinishShard(sum, b.length, c);
  return absl::OkStatus();
}

}  // namespace

int BucketsFor(int64_t elements, int64_t granule, int wanted) {
  return static_cast<int>(std::clamp<int64_t>(elements / std::max(granule, kMinBucketElements), 1, std::max(wanted, 1)));
}

int ReduceScatterBuckets(int64_t chunk, const codec::TwoLevelConfig& c, int wanted) {
  return chunk % c.group_size != 0 ? 1 : BucketsFor(chunk, c.group_size, wanted);
}

absl::Status TwoLevelReduceScatter(Op& op, const Topology& topo, const ShardLayout& layout, const float* padded,
                                   const codec::TwoLevelConfig& c, uint64_t seed, float* shard_sum, int buckets) {
  const int me = op.rank();
  const int64_t len = layout.chunk;
  const size_t carried = CarriedShards(topo, topo.region(me), me).size();
  std::vector<float> acc(carried * static_cast<size_t>(len));
  buckets = ReduceScatterBuckets(len, c, buckets);
  // Whole groups per bucket, the remainder spread over the first ones (one bucket: the chunk).
  const int64_t groups = len / c.group_size;
  std::vector<Bucket> parts;
  for (int64_t k = 0, at = 0; k < buckets; ++k) {
    const int64_t n = groups / buckets + (k < groups % buckets ? 1 : 0);
    const int64_t begin = at * c.group_size;
    parts.push_back({begin, k == buckets - 1 ? len - begin : n * c.group_size});
    at += n;
  }
  // Level 1 bucket after bucket on this thread; level 2 of each on a second one as soon as its
  // level 1 is summed, so the slow link carries one bucket while the next is quantised and summed.
  BucketPipeline p;
  p.buckets = buckets;
  p.produce = [&](Op& pop, int k) { return ReduceInsideRegion(pop, topo, len, padded, c, seed, parts[k], acc.data()); };
  p.produce_name = "its level 1 (inside the region)";
  p.transfer = [&](Op& pop, int k) {
    return ReduceAcrossRegions(pop, topo, len, acc.data(), c, seed, parts[k], shard_sum);
  };
  p.transfer_name = "its level 2 (across regions)";
  return RunBucketPipeline(op, p);
}

absl::Status BucketedAllGather(Op& op, const Topology& topo, const BucketedBlobs& b) {
  const int K = static_cast<int>(b.expected.size());
  std::vector<std::vector<std::string>> blobs(static_cast<size_t>(K), std::vector<std::string>(b.expected.front().size()));
  BucketPipeline p;
  p.buckets = K;
  p.produce = [&](Op&, int j) {
    b.encode(j, &blobs[j][op.rank()]);
    return absl::OkStatus();
  };
  p.produce_name = absl::StrCat(b.what, ": encode, all-gather inside the region and use");  // consume's thread
  p.transfer = [&](Op& t, int j) { return AllGatherAcrossRegions(t, topo, &blobs[j], b.expected[j], b.raw[j]); };
  p.transfer_name = absl::StrCat(b.what, ": all-gather across regions");
  p.consume = [&](Op& c, int j) {
    absl::Status s = AllGatherInsideRegion(c, topo, &blobs[j], b.expected[j], b.raw[j]);
    return s.ok() ? b.use(j, blobs[j]) : s;
  };
  p.beside = b.beside;
  p.beside_name = b.beside_name;
  return RunBucketPipeline(op, p);
}

absl::Status RunBucketPipeline(Op& op, const BucketPipeline& p) {
  std::vector<BucketSpan>& spans = op.stats().bucket_spans;
  const int pipeline = spans.empty() ? 0 : spans.back().pipeline + 1;
  absl::Mutex mu;
  std::vector<BucketSpan> timings;  // guarded by mu; added to the call's spans in start order
  // Runs one part of bucket k and keeps when it ran.
  auto timed = [&](char part, int k, auto&& run) {
    const absl::Time t0 = absl::Now();
    absl::Status s = run();
    const BucketSpan span{pipeline, k, part, t0 - op.start(), absl::Now() - op.start()};
    absl::MutexLock l(&mu);
    timings.push_back(span);
    return s;
  };
  auto keep_timings = [&](absl::Status s) {  // once the parts have ended
    std::stable_sort(timings.begin(), timings.end(),
                     [](const BucketSpan& a, const BucketSpan& b) { return a.start < b.start; });
    spans.insert(spans.end(), timings.begin(), timings.end());
    return s;
  };
  if (p.buckets == 1 && !p.beside) {  // nothing to overlap: no second thread
    absl::Status s = timed('p', 0, [&] { return p.produce(op, 0); });
    if (s.ok()) s = timed('t', 0, [&] { return p.transfer(op, 0); });
    if (s.ok() && p.consume) s = timed('c', 0, [&] { return p.consume(op, 0); });
    return keep_timings(s);
  }
  int produced = 0, transferred = 0;  // buckets
  bool stopped = false;               // a part failed: its error is the call's
  // Waits until `count` passes bucket k; false when a part failed first (a part that fails
  // aborts the transport, so any part blocked in a transfer fails too and none waits forever).
  auto wait = [&](const int& count, int k) {
    absl::MutexLock l(&mu);
    const auto ready = [&] { return stopped || count > k; };
    mu.Await(absl::Condition(&ready));
    return count > k;
  };
  auto advance = [&](int* count, int k) {
    absl::MutexLock l(&mu);
    *count = k + 1;
  };
  auto fail = [&](absl::Status s) {
    absl::MutexLock l(&mu);
    stopped = true;
    return s;
  };
  auto first = [&](Op& pop) -> absl::Status {
    for (int k = 0; k < p.buckets; ++k) {
      if (absl::Status s = timed('p', k, [&] { return p.produce(pop, k); }); !s.ok()) return fail(s);
      advance(&produced, k);
    }
    for (int k = 0; p.consume && k < p.buckets; ++k) {
      if (!wait(transferred, k)) return absl::OkStatus();
      if (absl::Status s = timed('c', k, [&] { return p.consume(pop, k); }); !s.ok()) return fail(s);
    }
    return absl::OkStatus();
  };
  auto second = [&](Op& pop) -> absl::Status {
    for (int k = 0; k < p.buckets; ++k) {
      if (!wait(produced, k)) return absl::OkStatus();
      if (absl::Status s = timed('t', k, [&] { return p.transfer(pop, k); }); !s.ok()) return fail(s);
      advance(&transferred, k);
    }
    return absl::OkStatus();
  };
  auto beside = [&](Op& pop) -> absl::Status {
    absl::Status s = p.beside(pop);
    return s.ok() ? s : fail(s);
  };
  return keep_timings(op.RunConcurrently(
      p.beside ? 3 : 2,
      [&](int part, Op& pop) { return part == 0 ? first(pop) : part == 1 ? second(pop) : beside(pop); },
      [&](int part) { return part == 0 ? p.produce_name : part == 1 ? p.transfer_name : p.beside_name; }));
}

}  // namespace longhaul::collective
