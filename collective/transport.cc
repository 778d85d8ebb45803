#include "collective/transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace longhaul::collective {

Mailbox::Mailbox(int rank, int size, int64_t max_message_bytes, int64_t max_buffered_bytes)
    : rank_(rank),
      size_(size),
      max_message_bytes_(max_message_bytes),
      max_buffered_bytes_(std::max(max_buffered_bytes, max_message_bytes)),
      poisoned_(static_cast<size_t>(std::max(size, 0))) {}

absl::Status Mailbox::Deliver(int from, uint64_t tag, std::string data, absl::Time deadline) {
  if (from < 0 || from >= size_ || from == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " of a group of ", size_,
                                                   " cannot take a message from rank ", from));
  }
  const int64_t n = static_cast<int64_t>(data.size());
  if (n > max_message_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("message of ", n, " bytes from rank ", from,
                                                     " exceeds the limit of ", max_message_bytes_, " bytes"));
  }
  absl::MutexLock l(&mu_);
  // Room when the message fits under the cap, or when nothing is buffered at all (so any message
  // below the per-message limit gets through eventually).
  auto room = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !aborted_.ok() || buffered_ == 0 || buffered_ + n <= max_buffered_bytes_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&room), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, " buffers ", buffered_,
                                                    " bytes not yet taken; no room for ", n, " more from rank ",
                                                    from, " before the deadline"));
  }
  if (!aborted_.ok()) return aborted_;
  buffered_ += n;
  queues_[{from, tag}].push_back(std::move(data));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Mailbox::Take(int from, uint64_t tag, absl::Time deadline) {
  if (from < 0 || from >= size_ || from == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " cannot receive from rank ", from));
  }
  absl::MutexLock l(&mu_);
  const std::pair<int, uint64_t> key{from, tag};
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (!aborted_.ok() || !poisoned_[from].ok()) return true;
    auto it = queues_.find(key);
    return it != queues_.end() && !it->second.empty();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError("no message arrived before the deadline");
  }
  if (!aborted_.ok()) return aborted_;
  if (!poisoned_[from].ok()) return poisoned_[from];
  auto it = queues_.find(key);
  std::string m = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  buffered_ -= static_cast<int64_t>(m.size());
  return m;
}

void Mailbox::Poison(int from, absl::Status why) {
  if (from < 0 || from >= size_) return;
  absl::MutexLock l(&mu_);
  if (poisoned_[from].ok()) poisoned_[from] = why.ok() ? absl::DataLossError("poisoned") : std::move(why);
}

void Mailbox::Abort(absl::Status why) {
  absl::MutexLock l(&mu_);
  if (aborted_.ok()) aborted_ = why.ok() ? absl::AbortedError("aborted") : std::move(why);
  queues_.clear();
  buffered_ = 0;
}

absl::Status Mailbox::aborted() {
  absl::MutexLock l(&mu_);
  return aborted_;
}

absl::Status Mailbox::SleepUnlessAborted(absl::Time until) {
  absl::MutexLock l(&mu_);
  auto is_aborted = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !aborted_.ok(); };
  mu_.AwaitWithDeadline(absl::Condition(&is_aborted), until);
  return aborted_;
}

int64_t Mailbox::buffered_bytes() {
  absl::MutexLock l(&mu_);
  return buffered_;
}

PeerShaper::PeerShaper(const netem::LinkProfile& p)
    : shaped_(p.shaped()),
      paced_(p.paced()),
      shaper_(p),
      pacer_(netem::LinkPacer(p)) {}

absl::Duration PeerShaper::PaceChunk(int64_t bytes) {
  if (!paced_) return absl::ZeroDuration();
  absl::MutexLock l(&mu_);
  return pacer_.Pace(bytes);
}

absl::Time PeerShaper::Admit(int64_t bytes) {
  if (!shaped_) return absl::Now();
  absl::MutexLock l(&mu_);
  return shaper_.Admit(bytes);
}

absl::Status PeerShaper::Pace(int64_t bytes, int64_t chunk_bytes, absl::Time deadline, Mailbox* abort_on) {
  if (!shaped_) return absl::OkStatus();
  absl::Time arrival = absl::Now();
  for (int64_t off = 0; off < bytes || off == 0; off += chunk_bytes) {
    arrival = Admit(std::min(chunk_bytes, bytes - off));
    if (bytes == 0) break;
  }
  return SleepUntil(arrival, deadline, "the shaped link delivers the message", abort_on);
}

absl::Status SleepUntil(absl::Time t, absl::Time deadline, absl::string_view what, Mailbox* abort_on) {
  const absl::Time until = std::min(t, deadline);
  if (abort_on != nullptr) {
    if (absl::Status a = abort_on->SleepUnlessAborted(until); !a.ok()) return a;
  } else if (const absl::Time now = absl::Now(); until > now) {
    absl::SleepFor(until - now);
  }
  if (t > deadline) return absl::DeadlineExceededError(absl::StrCat(what, " after the deadline"));
  return absl::OkStatus();
}

}  // namespace longhaul::collective
