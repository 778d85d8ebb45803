#include "collective/in_process_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace longhaul::collective {

namespace {
// Pacing granularity, the same as the gRPC transport's chunks.
constexpr int64_t kPaceChunkBytes = 1 << 20;
}  // namespace

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {
    for (int p = 0; p < hub->size(); ++p) {
      shapers_.push_back(std::make_unique<PeerShaper>(hub->options_.link ? hub->options_.link(rank, p)
                                                                          : netem::LinkProfile{}));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::string PeerName(int peer) const override { return absl::StrCat("rank ", peer, " (in-process)"); }

  absl::Status Send(int peer, uint64_t tag, absl::string_view data, absl::Time deadline) override {
    if (peer < 0 || peer >= size() || peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " cannot send to rank ", peer));
    }
    const absl::Time t0 = absl::Now();
    if (!hub_->alive(rank_)) return absl::UnavailableError(absl::StrCat("rank ", rank_, " is down"));
    // This rank's mailbox is aborted by any rank's Abort: it ends the wait for the link too.
    absl::Status s =
        shapers_[peer]->Pace(static_cast<int64_t>(data.size()), kPaceChunkBytes, deadline, hub_->boxes_[rank_].get());
    if (s.ok() && !hub_->alive(peer)) s = absl::UnavailableError("the peer is down");
    if (s.ok()) s = hub_->boxes_[peer]->Deliver(rank_, tag, std::string(data), deadline);
    absl::MutexLock l(&mu_);
    counters_.send_time += absl::Now() - t0;
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("sending ", data.size(), " bytes to ", PeerName(peer), ": ",
                                                 s.message()));
    }
    ++counters_.messages_sent;
    counters_.bytes_sent += static_cast<int64_t>(data.size());
    counters_.wire_bytes_sent += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Recv(int peer, uint64_t tag, absl::Time deadline) override {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::string> m = hub_->alive(rank_)
                                        ? hub_->boxes_[rank_]->Take(peer, tag, deadline)
                                        : absl::StatusOr<std::string>(absl::UnavailableError("this rank is down"));
    absl::MutexLock l(&mu_);
    counters_.recv_wait += absl::Now() - t0;
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("receiving from ", PeerName(peer), ": ", m.status().message()));
    }
    ++counters_.messages_received;
    counters_.bytes_received += static_cast<int64_t>(m->size());
    return m;
  }

  void Abort(const absl::Status& why) override {
    const absl::Status notice(absl::StatusCode::kAborted,
                              absl::StrCat("rank ", rank_, " aborted the group: ", why.message()));
    for (int p = 0; p < size(); ++p) {
      if (p == rank_ || hub_->alive(p)) hub_->boxes_[p]->Abort(p == rank_ ? why : notice);
    }
  }

  std::vector<std::string> UnreachablePeers(absl::Time) override {
    std::vector<std::string> out;
    for (int p = 0; p < size(); ++p) {
      if (p != rank_ && !hub_->alive(p)) out.push_back(absl::StrCat(PeerName(p), ": down"));
    }
    return out;
  }

  TransportCounters counters() const override {
    absl::MutexLock l(&mu_);
    return counters_;
  }

 private:
  InProcessHub* const hub_;
  const int rank_;
  std::vector<std::unique_ptr<PeerShaper>> shapers_;
  mutable absl::Mutex mu_;
  TransportCounters counters_ ABSL_GUARDED_BY(mu_);
};

InProcessHub::InProcessHub(int size, InProcessHubOptions o)
    : size_(size), options_(std::move(o)), dead_(static_cast<size_t>(size), false) {
  for (int r = 0; r < size; ++r) {
    boxes_.push_back(std::make_shared<Mailbox>(r, size, options_.max_message_bytes, options_.max_buffered_bytes));
  }
}

InProcessHub::~InProcessHub() = default;

std::unique_ptr<Transport> InProcessHub::Connect(int rank) {
  return std::make_unique<InProcessTransport>(this, rank);
}

void InProcessHub::Kill(int rank) {
  {
    absl::MutexLock l(&mu_);
    dead_[rank] = true;
  }
  // Its own blocked calls end; nothing it buffered will be read.
  boxes_[rank]->Abort(absl::UnavailableError(absl::StrCat("rank ", rank, " is down")));
}

bool InProcessHub::alive(int rank) {
  absl::MutexLock l(&mu_);
  return !dead_[rank];
}

}  // namespace longhaul::collective
