// A group of N ranks (the replicas of one pipeline stage) over a Transport: who is in which region,
// how a tensor is sharded among the ranks, and the bookkeeping of one collective call (tags,
// deadline, bytes and time, the error that names the peer). The algorithms are in algorithms.h;
// the per-step codecs (fp32, SDP4Bit, BitDP, ZeRO++) in data_parallel.h.
//
//   absl::StatusOr<Topology> topo = Topology::Create({"eu", "eu", "us", "us"});
//   Group g(transport.get(), *topo);                   // transport->rank() is this rank
//   absl::StatusOr<CallStats> s = g.AllReduceFp32(absl::MakeSpan(grad));
//
// Every rank must issue the same calls in the same order (each call has a sequence number that is
// part of its messages' tags). A call fails when any message does not arrive or cannot be sent by
// the call's deadline (GroupOptions::timeout from its start) or is malformed; the error names the
// peer and, after a timeout, the peers that do not answer a ping; the rank then aborts the group
// (transport.h), so the others fail at once too. A failed group stays failed: every later call
// returns the first error. Threading: one call at a time per Group (the rank's thread).
#ifndef LONGHAUL_COLLECTIVE_GROUP_H_
#define LONGHAUL_COLLECTIVE_GROUP_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collective/transport.h"

namespace longhaul::collective {

// Shards are cut at multiples of this many elements: whole quantisation groups (128 elements, the
// TLq-HS / qgZ group) and whole Hadamard blocks (32), so a shard quantised alone gives the same
// groups as the whole tensor would.
inline constexpr int64_t kShardAlign = 128;

class Topology {
 public:
  // regions[r] is rank r's region (any non-empty string; ranks with the same string share one).
  static absl::StatusOr<Topology> Create(std::vector<std::string> regions);

  int size() const { return static_cast<int>(region_of_.size()); }
  int num_regions() const { return static_cast<int>(members_.size()); }
  const std::string& region_name(int y) const { return names_[y]; }
  int region(int rank) const { return region_of_[rank]; }
  int local(int rank) const { return local_[rank]; }  // index within its region
  const std::vector<int>& members(int y) const { return members_[y]; }  // ascending
  // The rank of region y that carries shard k's traffic inside region y: the member with k's local
  // index (mod the region's size). In k's own region that is k. With X ranks in each of Y regions
  // this is qgZ's pairing: rank (y, x) exchanges with rank (y', x).
  int Partner(int y, int k) const { return members_[y][local_[k] % members_[y].size()]; }
  // Ranks ordered region by region (regions in order of first appearance): the fp32 ring, which
  // then crosses between regions only num_regions() times.
  const std::vector<int>& ring() const { return ring_; }

 private:
  std::vector<std::string> names_;
  std::vector<int> region_of_, local_, ring_;
  std::vector<std::vector<int>> members_;
};

// n elements cut into `parts` shards of `chunk` elements (a multiple of the alignment; the last
// shards may be shorter or empty). Shard k belongs to rank k.
struct ShardLayout {
  int64_t n = 0;
  int64_t chunk = 0;
  int parts = 1;
  int64_t padded() const { return chunk * parts; }
  int64_t begin(int k) const { return std::min<int64_t>(k * chunk, n); }
  int64_t length(int k) const { return std::min<int64_t>(n, (k + 1) * chunk) - begin(k); }
};
ShardLayout MakeShards(int64_t n, int parts, int64_t align = kShardAlign);

// When one bucket's part of a bucketed collective (RunBucketPipeline) ran, after its call's start:
// part 'p' produce, 't' transfer, 'c' consume; `pipeline` numbers the call's bucketed collectives
// in order (sdp4bit / zeropp: 0 the reduce-scatter, 1 the weights' all-gather; BitDP: 0 its planes).
struct BucketSpan {
  int pipeline = 0;
  int bucket = 0;
  char part = 'p';
  absl::Duration start, end;
};

// What one call cost this rank: the bytes it put on the wire against what the same messages
// would be as fp32, and where the time went.
struct CallStats {
  std::string op;
  int64_t elements = 0;                 // tensor elements synchronised
  int64_t messages_sent = 0;
  int64_t bytes_sent = 0;               // message payloads sent by this rank
  int64_t wire_bytes_sent = 0;          // the same with the transport's framing (chunk headers)
  int64_t bytes_sent_uncompressed = 0;  // the same messages' contents as fp32
  int64_t bytes_sent_inter_region = 0;  // the part of bytes_sent that crossed regions
  // That part by receiving rank (index: rank; shorter than the group when the last ranks got none):
  // each directed link has its own rate, so the busiest one, not the sum, bounds a call whose
  // messages to different peers overlap.
  std::vector<int64_t> inter_region_bytes_to;
  int64_t bytes_received = 0;
  absl::Duration wall = absl::ZeroDuration();
  // When the call began (Group::Begin); Add keeps the earliest. InfiniteFuture: no call.
  absl::Time start = absl::InfiniteFuture();
  // Inside Transport::Send and Recv, summed over a call's parts that run at the same time
  // (Op::Fork), so together they may exceed `wall`.
  absl::Duration send = absl::ZeroDuration();
  absl::Duration recv_wait = absl::ZeroDuration();
  // DataParallelSync::Step: inside the caller's update (the optimizer and, in a job, the clipping
  // norm's exchange along the pipeline, which waits for the other stages).
  absl::Duration update = absl::ZeroDuration();
  // DataParallelSync::Step: when its update began, after the call's start (InfiniteDuration: none
  // did), and what inter_region_bytes_to held then. What a call sends after its update (the weights'
  // all-gather of a sharded optimizer) cannot leave before it, nor the update begin before the
  // reduce-scatter has ended: the data-parallel sweep's chain bound (bench/dp_sweep_bench.cc).
  // One call's: Add keeps the first call's figures, so in a sum of calls
  // busiest_link_after_update() counts the other calls' bytes as after.
  absl::Duration update_start = absl::InfiniteDuration();
  std::vector<int64_t> inter_region_bytes_to_before_update;
  // When each of the call's phases (Op::NextPhase) began, after the call's start: where a step's
  // time goes between its transfers and its own work (not the parts of Op::RunConcurrently, so not a
  // bucketed collective's: docs/replicated-stages.md measured with them before the buckets). Add
  // keeps the first call's.
  std::vector<absl::Duration> phase_starts;
  // A bucketed call's parts, bucket by bucket (with more than one bucket they run on threads of
  // their own, whose phases phase_starts does not show). Add keeps the first non-empty one's, so
  // in a sum of calls they are one call's.
  std::vector<BucketSpan> bucket_spans;
  int64_t busiest_inter_region_link() const;  // the largest of inter_region_bytes_to (0 if none)
  // The busiest directed link's bytes before the update and after it (without an update: 0 and
  // busiest_inter_region_link()).
  int64_t busiest_link_before_update() const;
  int64_t busiest_link_after_update() const;
  double compression() const {
    return bytes_sent > 0 ? static_cast<double>(bytes_sent_uncompressed) / static_cast<double>(bytes_sent) : 1.0;
  }
  void Add(const CallStats& o);
  std::string ToString() const;
};

struct GroupOptions {
  absl::Duration timeout = absl::Seconds(120);  // per call
};

class Group;

// One collective call in progress (Group::Begin .. Group::Finish): tags, the deadline, the meter.
class Op {
 public:
  // The phases a call has on its own Op, and those each part of RunConcurrently has (its first and
  // its NextPhase calls).
  static constexpr uint32_t kOwnPhases = 32;
  static constexpr uint32_t kPhasesPerPart = 32;
  // A new phase of the call: messages of different phases never match each other.
  void NextPhase();
  // `raw_bytes`: the message's contents as fp32 (for the compression figures).
  absl::Status Send(int peer, uint32_t index, absl::string_view data, int64_t raw_bytes);
  // `expected_bytes` >= 0: any other length is an error naming the peer.
  absl::StatusOr<std::string> Recv(int peer, uint32_t index, int64_t expected_bytes = -1);
  absl::Time deadline() const { return deadline_; }
  absl::Time start() const { return start_; }  // when the call began (Group::Begin)
  CallStats& stats() { return stats_; }
  // "rank 2 (host:port)", for errors about what a peer sent.
  std::string PeerName(int peer) const;
  int rank() const;
  // Runs task(i, part_i) for i in [0, n) (1 <= n <= 4) at the same time, task 0 on this thread and
  // the others on threads of their own. Each part_i is this call on another thread: the same
  // deadline, its own kPhasesPerPart phases (above any the rest of the call reaches, and above
  // those of an earlier RunConcurrently of the call, so their messages never match; a message past
  // them is an error) and its own counters, added back at the end. A task that fails aborts the
  // transport, so the others stop at once rather than at their deadline; the first failure in time
  // (the cause, not the others' aborts) is returned, prefixed with part(i). n == 1 runs task 0 on
  // this Op.
  // Every rank must run the same parts in the same order (their phases are numbered by i).
  absl::Status RunConcurrently(int n, const std::function<absl::Status(int, Op&)>& task,
                               const std::function<std::string(int)>& part);

 private:
  friend class Group;
  // A part of this call for another thread (RunConcurrently): phases from `first_phase` on, its
  // own counters, which Absorb adds back once that thread is done.
  Op Fork(uint32_t first_phase) const;
  void Absorb(const Op& fork);
  Op(Group* g, uint64_t seq, absl::Time start, absl::Time deadline)
      : g_(g), seq_(seq), start_(start), deadline_(deadline) {}
  uint64_t Tag(uint32_t index) const;
  Group* g_;
  uint64_t seq_;
  absl::Status PhaseInRange() const;
  uint32_t phase_ = 0;
  uint32_t last_phase_ = kOwnPhases - 1;  // the last this Op may send or receive in
  uint32_t next_fork_phase_ = kOwnPhases;  // where the call's next RunConcurrently numbers its parts from
  bool forked_ = false;                    // a part of RunConcurrently's
  absl::Time start_, deadline_;
  int64_t wire_start_ = 0;  // the transport's wire byte counter when the call began
  CallStats stats_;
};

class Group {
 public:
  // `t` (not owned) must outlive the group; t->size() must equal topo.size().
  Group(Transport* t, Topology topo, GroupOptions o = {});

  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }
  const Topology& topology() const { return topo_; }
  Transport* transport() const { return t_; }
  ShardLayout Shards(int64_t n) const { return MakeShards(n, size()); }
  // Sums over every call so far.
  const CallStats& totals() const { return totals_; }

  // x = the elementwise sum over all ranks, bit-identical on every rank: ring reduce-scatter (each
  // shard summed along the ring in one fixed order) then ring all-gather of the sums.
  absl::StatusOr<CallStats> AllReduceFp32(absl::Span<float> x);
  // (*all)[k] = rank k's `mine`, whose length must be expected_bytes[k] (two-level all-gather).
  absl::StatusOr<CallStats> AllGatherBytes(std::string mine, const std::vector<int64_t>& expected_bytes,
                                           std::vector<std::string>* all);

  // For the step algorithms: a call is Begin, any messages through the Op, then Finish with the
  // outcome, which records the stats and, on error, names the unreachable peers and aborts.
  absl::StatusOr<Op> Begin(std::string name, int64_t elements);
  absl::StatusOr<CallStats> Finish(Op& op, absl::Status outcome);
  // For a failed `outcome` that is a timeout: "; unreachable: <the peers that do not answer>" (the
  // peer waited on may itself be waiting on the dead one); else empty. Waits up to about a second.
  std::string UnreachableNote(const absl::Status& outcome) const;

 private:
  friend class Op;
  Transport* const t_;
  const Topology topo_;
  const GroupOptions o_;
  uint64_t seq_ = 0;
  absl::Status failed_;
  CallStats totals_;
};

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_GROUP_H_
