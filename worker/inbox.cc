#include "worker/inbox.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::worker {

Inbox::Inbox(size_t capacity, std::string peer, DecodeTarget decode, int64_t max_frame_bytes)
    : capacity_(capacity < 1 ? 1 : capacity),
      peer_(std::move(peer)),
      decode_(std::move(decode)),
      max_frame_bytes_(max_frame_bytes) {}

void Inbox::CreateQueues(int stripes) {
  const size_t k = static_cast<size_t>(stripes);
  const size_t share = (capacity_ + k - 1) / k;  // each stream's part of the capacity
  for (int i = 0; i < stripes; ++i) {
    queues_[i] = std::make_unique<Queue>(share);
    if (!closed_[i].ok()) queues_[i]->Close(closed_[i]);
    if (!cancelled_.ok()) queues_[i]->Cancel(cancelled_);
  }
  stripes_ = stripes;
}

bool Inbox::SetStripes(int stripes) {
  absl::MutexLock l(&mu_);
  if (stripes < 1 || stripes > kMaxStripes) return false;
  if (stripes_ > 0) return stripes == stripes_;
  // Before any stream arrived nothing was pushed or popped, so the deal starts at stream 0.
  CreateQueues(stripes);
  return true;
}

absl::Status Inbox::Push(stage_runtime::LinkMessage m, int stripe) {
  Queue* q;
  {
    absl::MutexLock l(&mu_);
    if (stripes_ == 0) CreateQueues(1);
    if (stripe < 0 || stripe >= stripes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("message on stream ", stripe, " of a link from ", peer_, " with ", stripes_, " stream(s)"));
    }
    q = queues_[stripe].get();
  }
  return q->Push(std::move(m));  // blocks while this stream's share is full
}

absl::StatusOr<stage_runtime::LinkMessage> Inbox::Pop(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto timed_out = [&] {
    return absl::DeadlineExceededError(absl::StrCat("no frame from ", peer_, " for ", absl::FormatDuration(timeout)));
  };
  absl::MutexLock pl(&pop_mu_);
  Queue* q;
  int stream;
  {
    absl::MutexLock l(&mu_);
    // A Pop may come before the first stream announced the stripe count.
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stripes_ > 0 || !cancelled_.ok(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) return timed_out();
    if (!cancelled_.ok()) return cancelled_;
    stream = static_cast<int>(popped_ % static_cast<uint64_t>(stripes_));
    q = queues_[stream].get();
  }
  absl::StatusOr<stage_runtime::LinkMessage> m = q->Pop(deadline - absl::Now());
  if (m.ok()) {
    ++popped_;
    return m;
  }
  if (absl::IsDeadlineExceeded(m.status())) {
    // The queue's own timeout (a close or cancel reason would be what this inbox recorded).
    absl::MutexLock l(&mu_);
    if (!cancelled_.ok()) return cancelled_;
    if (!closed_[stream].ok()) return closed_[stream];
    return timed_out();
  }
  return m.status();
}

void Inbox::Close(absl::Status why, int stripe) {
  absl::MutexLock l(&mu_);
  const absl::Status st = why.ok() ? absl::UnavailableError(absl::StrCat("link from ", peer_, " closed")) : why;
  for (int i = 0; i < kMaxStripes; ++i) {
    if ((stripe >= 0 && stripe != i) || !closed_[i].ok()) continue;
    closed_[i] = st;
    if (queues_[i]) queues_[i]->Close(st);
  }
}

void Inbox::Cancel(absl::Status why) {
  absl::MutexLock l(&mu_);
  if (!cancelled_.ok()) return;
  cancelled_ = why.ok() ? absl::CancelledError("cancelled") : std::move(why);
  for (std::unique_ptr<Queue>& q : queues_) {
    if (q) q->Cancel(cancelled_);
  }
}

}  // namespace longhaul::worker
