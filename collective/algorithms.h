// The collective algorithms, each written once against an Op (group.h) and therefore against any
// Transport. Buffers are plain floats; a tensor of n elements is handled "padded": P * chunk
// elements (ShardLayout), zeros past n, so every shard is whole groups.
//
// Bytes each rank sends (P ranks, c = layout.chunk, b(m, k) = SymQuantPayloadBytes(m) at k bits):
//   RingReduceScatter, RingAllGather:   (P - 1) * c * 4 each
//   TwoLevelReduceScatter with X ranks in each of Y regions (P = X * Y):
//     level 1, inside the region:  (X - 1) messages of Y pieces of b(c, fast bits)
//     level 2, across regions:     (Y - 1) messages of b(c, slow bits)
//   (in buckets, as many messages per bucket, of the bucket's elements: the same bytes in all)
//   TwoLevelAllGather of blobs of B bytes:
//     across regions (Y - 1) * B; inside the region (X - 1) * Y * B (own blob + the Y - 1 blobs
//     this rank received from its partners in the other regions)
#ifndef LONGHAUL_COLLECTIVE_ALGORITHMS_H_
#define LONGHAUL_COLLECTIVE_ALGORITHMS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "codec/sdp4bit.h"
#include "collective/group.h"

namespace longhaul::collective {

// The shards rank m (a member of region y) carries inside region y in the two-level
// reduce-scatter: those whose partner in y is m (Topology::Partner), ascending.
std::vector<int> CarriedShards(const Topology& topo, int y, int m);
// The blobs rank r hands to the other members of its region in the two-level all-gather: its own
// and those of the ranks in other regions whose partner in r's region is r, ascending.
std::vector<int> ForwardedBlobs(const Topology& topo, int r);

// Ring reduce-scatter over topo.ring(). On return shard k (= rank k's) of this rank's
// padded[0, layout.padded()) holds the sum over all ranks of that shard; other shards hold partial
// sums. The order of the additions for shard k is fixed (along the ring, starting after k), so the
// result does not depend on timing.
absl::Status RingReduceScatter(Op& op, const Topology& topo, const ShardLayout& layout, float* padded);

// Ring all-gather: on entry shard rank() holds this rank's values, on return every shard holds its
// owner's, byte for byte.
absl::Status RingAllGather(Op& op, const Topology& topo, const ShardLayout& layout, float* padded);

// Two-level all-gather of opaque blobs: (*blobs)[rank] is this rank's on entry; on return
// (*blobs)[k] is rank k's for every k. Each blob crosses to every other region once (to rank k's
// partner there), then partners forward inside their regions. A received blob whose length is not
// expected_bytes[k] is an error; raw_bytes[k] is blob k's contents as fp32 (for the stats).
absl::Status TwoLevelAllGather(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                               const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes);
// Its two levels, one phase each, for callers that pipeline them (the second needs the first's
// blobs): across regions, then inside the region.
absl::Status AllGatherAcrossRegions(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                                    const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes);
absl::Status AllGatherInsideRegion(Op& op, const Topology& topo, std::vector<std::string>* blobs,
                                   const std::vector<int64_t>& expected_bytes, const std::vector<int64_t>& raw_bytes);

// The two-level quantised gradient reduce-scatter of SDP4Bit's TLq-HS (c = codec::TlqHs()) and
// ZeRO++'s qgZ (c = codec::Ulq()). Level 1 inside each region: rank r sends member m the shards m
// carries for the slow level (Topology::Partner), each shard quantised on its own at c.fast_bits
// with the fused forward Hadamard; each carrier sums what it receives in the Hadamard domain (its own contribution
// transformed but not quantised, additions in member order). Level 2 across regions: the carrier
// sends each partial to the shard's owner at c.slow_bits; the owner sums the regions' partials in
// region order and applies the inverse Hadamard once. Uneven regions work the same way (a region
// with fewer ranks carries several shards per rank). `seed` keys stochastic rounding.
// On return shard_sum[0, layout.chunk) approximates the sum of shard rank() over all ranks.
//
// `buckets` > 1 (ReduceScatterBuckets decides how many the chunk takes) pipelines the two levels:
// the chunk's groups are cut into that many buckets, level 1 runs bucket after bucket on this
// thread and level 2 of each on a second thread as soon as its level 1 is summed (Op::
// RunConcurrently), so one bucket crosses the slow link while the next is quantised and summed
// inside the region. Every piece is quantised with its own groups and its elements' draws, so the
// result is bit for bit the unbucketed one, and the bytes are the same. Every rank must pass the
// same `buckets`.
absl::Status TwoLevelReduceScatter(Op& op, const Topology& topo, const ShardLayout& layout, const float* padded,
                                   const codec::TwoLevelConfig& c, uint64_t seed, float* shard_sum, int buckets = 1);
// A collective in buckets, pipelined (RunBucketPipeline): `produce` runs bucket after bucket on the
// calling thread, `transfer` on a second thread each bucket as soon as it is produced, then
// `consume` (if any) back on the calling thread each bucket as soon as it is transferred; `beside`
// (if any) on a third thread at the same time. So a slow link carries one bucket while the next is
// produced and the previous consumed. A part that fails stops the others (Op::RunConcurrently);
// the first failure is returned, prefixed with its part's name. One bucket and nothing beside runs
// all on the calling thread. Every rank must run the same buckets, and a transfer part's phases
// must fit in Op::kPhasesPerPart.
struct BucketPipeline {
  int buckets = 1;
  std::function<absl::Status(Op&, int)> produce, transfer;
  std::function<absl::Status(Op&, int)> consume;  // on produce's Op (its thread)
  std::function<absl::Status(Op&)> beside;
  std::string produce_name, transfer_name, beside_name;  // produce_name: consume's too (its thread)
};
absl::Status RunBucketPipeline(Op& op, const BucketPipeline& p);

// A two-level all-gather of every rank's blob of each bucket (expected[j][k] / raw[j][k]: bucket
// j's blob of rank k, as TwoLevelAllGather's), pipelined on RunBucketPipeline: encode(j, &mine)
// on this thread bucket after bucket; each bucket across regions on a second thread; back on this
// thread, each bucket inside the region and then use(j, blobs) as soon as it has crossed, so the
// slow link never waits for a bucket's forwarding or use. `beside` runs beside them (optional).
// `what` names the blobs in errors ("its weights").
struct BucketedBlobs {
  std::vector<std::vector<int64_t>> expected, raw;
  std::function<void(int, std::string*)> encode;
  std::function<absl::Status(int, const std::vector<std::string>&)> use;
  std::function<absl::Status(Op&)> beside;
  std::string what, beside_name;
};
absl::Status BucketedAllGather(Op& op, const Topology& topo, const BucketedBlobs& b);

// How many of `wanted` buckets (at least 1) a collective cuts `elements` into, each of whole
// granules (quantisation groups) and none under kMinBucketElements (a message's fixed costs);
// every quantised collective's rule.
inline constexpr int64_t kMinBucketElements = 16384;
int BucketsFor(int64_t elements, int64_t granule, int wanted);
// TwoLevelReduceScatter's: BucketsFor the chunk, 1 unless the chunk is whole groups.
int ReduceScatterBuckets(int64_t chunk, const codec::TwoLevelConfig& c, int wanted);

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_ALGORITHMS_H_
