// BoundedQueue<T>: a thread-safe FIFO of bounded capacity between producers and consumers that
// may block, with the two ways a queue ends in longhaul:
//   Close(why)   no more items will come: Pop drains what is queued, then returns `why`;
//   Cancel(why)  give up now: queued items are dropped, Push and Pop return `why` at once, and
//                every blocked caller wakes up.
//
//   BoundedQueue<Item> q(8);
//   producer:  if (absl::Status s = q.Push(std::move(item)); !s.ok()) return s;
//   consumer:  absl::StatusOr<Item> it = q.Pop(absl::Seconds(5));
//
// Threading: every method may be called from any thread.
#ifndef LONGHAUL_COMMON_BOUNDED_QUEUE_H_
#define LONGHAUL_COMMON_BOUNDED_QUEUE_H_

#include <cstddef>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace longhaul::common {

template <typename T>
class BoundedQueue {
 public:
  // A capacity of 0 is taken as 1.
  explicit BoundedQueue(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Appends `item`, blocking while the queue is full. After Close or Cancel the item is dropped
  // and the reason returned.
  absl::Status Push(T item) {
    absl::MutexLock l(&mu_);
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return q_.size() < capacity_ || !ended_.ok() || !cancelled_.ok();
    };
    const absl::Time t0 = absl::Now();
    mu_.Await(absl::Condition(&room));
    push_wait_ += absl::Now() - t0;
    if (!cancelled_.ok()) return cancelled_;
    if (!ended_.ok()) return ended_;
    q_.push_back(std::move(item));
    return absl::OkStatus();
  }

  // The oldest item. Blocks until there is one, the queue is closed and empty (returns the close
  // reason), cancelled (returns the cancel reason), or `timeout` passed (DeadlineExceeded).
  absl::StatusOr<T> Pop(absl::Duration timeout = absl::InfiniteDuration()) {
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !q_.empty() || !ended_.ok() || !cancelled_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("nothing arrived within ", absl::FormatDuration(timeout)));
    }
    if (!cancelled_.ok()) return cancelled_;
    if (q_.empty()) return ended_;
    T item = std::move(q_.front());
    q_.pop_front();
    return item;
  }

  // No more items will be pushed; `why` (not OK; an OK status becomes OutOfRange "closed") is
  // what Push and a Pop on the drained queue return. The first reason sticks.
  void Close(absl::Status why = absl::OutOfRangeError("closed")) {
    absl::MutexLock l(&mu_);
    if (ended_.ok()) ended_ = why.ok() ? absl::OutOfRangeError("closed") : std::move(why);
  }

  // Drops what is queued and makes every current and later call fail with `why` (an OK status
  // becomes Cancelled). The first reason sticks.
  void Cancel(absl::Status why) {
    absl::MutexLock l(&mu_);
    if (cancelled_.ok()) cancelled_ = why.ok() ? absl::CancelledError("cancelled") : std::move(why);
    q_.clear();
  }

  size_t size() {
    absl::MutexLock l(&mu_);
    return q_.size();
  }
  size_t capacity() const { return capacity_; }

  // Time Push() spent blocked on a full queue since the last call.
  absl::Duration TakePushWait() {
    absl::MutexLock l(&mu_);
    return std::exchange(push_wait_, absl::ZeroDuration());
  }

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  std::deque<T> q_ ABSL_GUARDED_BY(mu_);
  absl::Status ended_ ABSL_GUARDED_BY(mu_);      // non-OK once closed
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);  // non-OK once cancelled
  absl::Duration push_wait_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_BOUNDED_QUEUE_H_
