#include "collective/group.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "collective/algorithms.h"

namespace longhaul::collective {

namespace {
// Tag layout: call sequence number (40 bits) | phase (8 bits) | index (16 bits). The all-ones tag
// is the abort notice, which a sequence number never reaches.
constexpr int kPhaseShift = 16;
constexpr int kSeqShift = 24;
}  // namespace

absl::StatusOr<Topology> Topology::Create(std::vector<std::string> regions) {
  if (regions.empty()) return absl::InvalidArgumentError("a group needs at least one rank");
  if (regions.size() > 65535) return absl::InvalidArgumentError("at most 65535 ranks in a group");
  Topology t;
  for (int r = 0; r < static_cast<int>(regions.size()); ++r) {
    if (regions[r].empty()) return absl::InvalidArgumentError(absl::StrCat("rank ", r, " has no region"));
    auto it = std::find(t.names_.begin(), t.names_.end(), regions[r]);
    int y = static_cast<int>(it - t.names_.begin());
    if (it == t.names_.end()) {
      t.names_.push_back(regions[r]);
      t.members_.emplace_back();
    }
    t.region_of_.push_back(y);
    t.local_.push_back(static_cast<int>(t.members_[y].size()));
    t.members_[y].push_back(r);
  }
  for (const auto& m : t.members_) t.ring_.insert(t.ring_.end(), m.begin(), m.end());
  return t;
}

ShardLayout MakeShards(int64_t n, int parts, int64_t align) {
  ShardLayout l;
  l.n = n;
  l.parts = parts < 1 ? 1 : parts;
  const int64_t unit = align * l.parts;
  l.chunk = std::max<int64_t>(1, (n + unit - 1) / unit) * align;
  return l;
}

void CallStats::Add(const CallStats& o) {
  elements += o.elements;
  messages_sent += o.messages_sent;
  bytes_sent += o.bytes_sent;
  wire_bytes_sent += o.wire_bytes_sent;
  bytes_sent_uncompressed += o.bytes_sent_uncompressed;
  bytes_sent_inter_region += o.bytes_sent_inter_region;
  if (inter_region_bytes_to.size() < o.inter_region_bytes_to.size()) {
    inter_region_bytes_to.resize(o.inter_region_bytes_to.size(), 0);
  }
  for (size_t k = 0; k < o.inter_region_bytes_to.size(); ++k) inter_region_bytes_to[k] += o.inter_region_bytes_to[k];
  bytes_received += o.bytes_received;
  wall += o.wall;
  start = std::min(start, o.start);
  send += o.send;
  recv_wait += o.recv_wait;
  update += o.update;
  if (phase_starts.empty()) phase_starts = o.phase_starts;
  if (update_start == absl::InfiniteDuration()) {
    update_start = o.update_start;
    inter_region_bytes_to_before_update = o.inter_region_bytes_to_before_update;
  }
  if (bucket_spans.empty()) bucket_spans = o.bucket_spans;
}

int64_t CallStats::busiest_inter_region_link() const {
  int64_t m = 0;
  for (int64_t b : inter_region_bytes_to) m = std::max(m, b);
  return m;
}

int64_t CallStats::busiest_link_before_update() const {
  int64_t m = 0;
  for (int64_t b : inter_region_bytes_to_before_update) m = std::max(m, b);
  return m;
}

int64_t CallStats::busiest_link_after_update() const {
  int64_t m = 0;
  for (size_t k = 0; k < inter_region_bytes_to.size(); ++k) {
    const int64_t before = k < inter_region_bytes_to_before_update.size() ? inter_region_bytes_to_before_update[k] : 0;
    m = std::max(m, inter_region_bytes_to[k] - before);
  }
  return m;
}

std::string CallStats::ToString() const {
  return absl::StrCat(op, ": ", elements, " elements, sent ", bytes_sent, " bytes in ", messages_sent,
                      " messages (", wire_bytes_sent, " with framing; ", bytes_sent_uncompressed, " as fp32, x",
                      absl::SixDigits(compression()), "; ",
                      bytes_sent_inter_region, " across regions), received ", bytes_received, " bytes, ",
                      absl::FormatDuration(wall), " (send ", absl::FormatDuration(send), ", waiting ",
                      absl::FormatDuration(recv_wait), update > absl::ZeroDuration() ? ", update " : "",
                      update > absl::ZeroDuration() ? absl::FormatDuration(update) : "", ")");
}

uint64_t Op::Tag(uint32_t index) const {
  return (seq_ << kSeqShift) | (uint64_t{phase_ & 0xff} << kPhaseShift) | (index & 0xffff);
}

void Op::NextPhase() {
  ++phase_;
  if (!forked_) stats_.phase_starts.push_back(absl::Now() - start_);  // the call's own (CallStats)
}

std::string Op::PeerName(int peer) const { return g_->t_->PeerName(peer); }

namespace {
// The parts of a call that run at the same time (Op::RunConcurrently) number their phases after
// the call's own (Op::kOwnPhases), kPhasesPerPart each, every RunConcurrently of a call after the
// previous one's parts; Tag keeps 8 bits of phase.
constexpr uint32_t kPhaseSpace = 256;
constexpr int kMaxParts = 4;
}  // namespace

absl::Status Op::RunConcurrently(int n, const std::function<absl::Status(int, Op&)>& task,
                                 const std::function<std::string(int)>& part) {
  if (n == 1) return task(0, *this);
  const uint32_t base = next_fork_phase_;
  if (n < 1 || n > kMaxParts || forked_ || base + static_cast<uint32_t>(n) * kPhasesPerPart > kPhaseSpace) {
    return absl::InternalError(absl::StrCat(n, " concurrent parts of a call",
                                            forked_ ? " inside another's part" : " (or too many such calls in one)"));
  }
  next_fork_phase_ = base + static_cast<uint32_t>(n) * kPhasesPerPart;
  const std::string who = absl::StrCat(stats_.op, " on rank ", g_->rank(), ": ");
  std::vector<Op> forks;
  for (int i = 0; i < n; ++i) forks.push_back(Fork(base + static_cast<uint32_t>(i) * kPhasesPerPart));
  absl::Mutex mu;
  absl::Status first;  // guarded by mu
  auto run = [&](int i) {
    absl::Status s = task(i, forks[i]);
    if (s.ok()) return;
    s = absl::Status(s.code(), absl::StrCat(part(i), ": ", s.message()));
    {
      absl::MutexLock l(&mu);
      if (!first.ok()) return;  // a consequence of the first failure's abort
      first = s;  // Group::Finish adds the unreachable peers to what the call returns
    }
    // The peers' view of it: said before the others' aborts can say less.
    g_->transport()->Abort(absl::Status(s.code(), absl::StrCat(who, s.message(), g_->UnreachableNote(s))));
  };
  // No part starts before every thread exists: parts may wait for each other, so a thread that
  // cannot be created must stop the call before any part runs rather than leave others waiting.
  absl::Notification go;
  bool abandoned = false;  // written before go is notified
  {
    std::vector<std::thread> threads;
    struct JoinAll {
      std::vector<std::thread>& t;
      ~JoinAll() {
        for (std::thread& x : t) x.join();
      }
    } join{threads};
    try {
      for (int i = 1; i < n; ++i) {
        threads.emplace_back([&, i] {
          go.WaitForNotification();
          if (!abandoned) run(i);
        });
      }
    } catch (const std::system_error& e) {
      abandoned = true;
      go.Notify();
      return absl::ResourceExhaustedError(absl::StrCat(who, "cannot start a thread for a part of the call: ", e.what()));
    }
    go.Notify();
    run(0);
  }
  for (const Op& f : forks) Absorb(f);
  return first;
}

Op Op::Fork(uint32_t first_phase) const {
  Op f(g_, seq_, start_, deadline_);
  f.forked_ = true;
  f.phase_ = first_phase;
  f.last_phase_ = first_phase + kPhasesPerPart - 1;
  f.stats_.op = stats_.op;
  return f;
}

void Op::Absorb(const Op& fork) {
  CallStats s = fork.stats_;
  s.elements = 0;  // the call's, counted once
  s.wall = absl::ZeroDuration();
  s.wire_bytes_sent = 0;  // Finish takes the transport's counter, which has both parts
  stats_.Add(s);
}
int Op::rank() const { return g_->rank(); }

absl::Status Op::PhaseInRange() const {
  if (phase_ <= last_phase_) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(stats_.op, ": phase ", phase_, " is past this part's last (", last_phase_, ")"));
}

absl::Status Op::Send(int peer, uint32_t index, absl::string_view data, int64_t raw_bytes) {
  if (absl::Status s = PhaseInRange(); !s.ok()) return s;
  const absl::Time t0 = absl::Now();
  absl::Status s = g_->t_->Send(peer, Tag(index), data, deadline_);
  stats_.send += absl::Now() - t0;
  if (!s.ok()) return s;
  ++stats_.messages_sent;
  const int64_t n = static_cast<int64_t>(data.size());
  stats_.bytes_sent += n;
  stats_.bytes_sent_uncompressed += raw_bytes;
  if (g_->topo_.region(peer) != g_->topo_.region(g_->rank())) {
    stats_.bytes_sent_inter_region += n;
    std::vector<int64_t>& to = stats_.inter_region_bytes_to;
    if (to.size() <= static_cast<size_t>(peer)) to.resize(static_cast<size_t>(peer) + 1, 0);
    to[static_cast<size_t>(peer)] += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Op::Recv(int peer, uint32_t index, int64_t expected_bytes) {
  if (absl::Status s = PhaseInRange(); !s.ok()) return s;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> m = g_->t_->Recv(peer, Tag(index), deadline_);
  stats_.recv_wait += absl::Now() - t0;
  if (!m.ok()) return m.status();
  stats_.bytes_received += static_cast<int64_t>(m->size());
  if (expected_bytes >= 0 && static_cast<int64_t>(m->size()) != expected_bytes) {
    return absl::DataLossError(absl::StrCat(g_->t_->PeerName(peer), " sent ", m->size(), " bytes where ",
                                            expected_bytes, " were due (phase ", phase_, ", part ", index, ")"));
  }
  return m;
}

Group::Group(Transport* t, Topology topo, GroupOptions o) : t_(t), topo_(std::move(topo)), o_(o) {
  if (t_->size() != topo_.size()) {
    failed_ = absl::InvalidArgumentError(
        absl::StrCat("the transport has ", t_->size(), " ranks, the topology ", topo_.size()));
  }
}

absl::StatusOr<Op> Group::Begin(std::string name, int64_t elements) {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the group is unusable: ", failed_.message()));
  }
  const absl::Time now = absl::Now();
  Op op(this, seq_++, now, now + o_.timeout);
  op.wire_start_ = t_->counters().wire_bytes_sent;
  op.stats_.op = std::move(name);
  op.stats_.elements = elements;
  return op;
}

absl::StatusOr<CallStats> Group::Finish(Op& op, absl::Status outcome) {
  op.stats_.wall = absl::Now() - op.start_;
  op.stats_.start = op.start_;
  // The group is its transport's only user, so the counter's growth is this call's.
  op.stats_.wire_bytes_sent = t_->counters().wire_bytes_sent - op.wire_start_;
  if (outcome.ok()) {
    totals_.Add(op.stats_);
    return op.stats_;
  }
  const std::string msg = absl::StrCat(op.stats_.op, " (call ", op.seq_, ") on rank ", rank(), ": ", outcome.message(),
                                       UnreachableNote(outcome));
  failed_ = absl::Status(outcome.code(), msg);
  t_->Abort(failed_);
  return failed_;
}

std::string Group::UnreachableNote(const absl::Status& outcome) const {
  if (outcome.code() != absl::StatusCode::kDeadlineExceeded) return "";
  // The peer this rank waited for may itself be waiting for the one that died: say who does not
  // answer at all.
  const std::vector<std::string> dead = t_->UnreachablePeers(absl::Now() + absl::Seconds(1));
  return dead.empty() ? "" : absl::StrCat("; unreachable: ", absl::StrJoin(dead, "; "));
}

absl::StatusOr<CallStats> Group::AllReduceFp32(absl::Span<float> x) {
  absl::StatusOr<Op> op = Begin("allreduce-fp32", static_cast<int64_t>(x.size()));
  if (!op.ok()) return op.status();
  const ShardLayout l = Shards(static_cast<int64_t>(x.size()));
  std::vector<float> padded(static_cast<size_t>(l.padded()), 0.0f);
  if (!x.empty()) std::memcpy(padded.data(), x.data(), x.size() * sizeof(float));
  absl::Status s = RingReduceScatter(*op, topo_, l, padded.data());
  if (s.ok()) s = RingAllGather(*op, topo_, l, padded.data());
  if (s.ok() && !x.empty()) std::memcpy(x.data(), padded.data(), x.size() * sizeof(float));
  return Finish(*op, s);
}

absl::StatusOr<CallStats> Group::AllGatherBytes(std::string mine, const std::vector<int64_t>& expected_bytes,
                                                std::vector<std::string>* all) {
  int64_t total = 0;
  for (int64_t b : expected_bytes) total += b;
  absl::StatusOr<Op> op = Begin("allgather-bytes", total / 4);
  if (!op.ok()) return op.status();
  if (static_cast<int>(expected_bytes.size()) != size() ||
      static_cast<int64_t>(mine.size()) != expected_bytes[rank()]) {
    return Finish(*op, absl::InvalidArgumentError("expected_bytes must give every rank's length, this one's included"));
  }
  all->assign(static_cast<size_t>(size()), std::string());
  (*all)[rank()] = std::move(mine);
  return Finish(*op, TwoLevelAllGather(*op, topo_, all, expected_bytes, expected_bytes));
}

}  // namespace longhaul::collective
