// Injected time: everything that waits or measures time — shapers, heartbeats,
// timeouts — takes a Clock, so tests drive it with FakeClock instead of sleeping.
//
//   common::Clock* clock = common::RealClock();
//   common::FakeClock fake;  fake.Advance(absl::Milliseconds(5));
#ifndef LONGHAUL_COMMON_CLOCK_H_
#define LONGHAUL_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace longhaul::common {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration d) = 0;
};

// The process-wide real clock (thread-safe, never destroyed).
Clock* RealClock();

// A clock that only moves when told to. SleepFor advances it by the requested duration (so code
// that paces itself by sleeping runs instantly and deterministically). Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() override;
  void SleepFor(absl::Duration d) override;
  void Advance(absl::Duration d);
  absl::Duration total_slept();

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration slept_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_CLOCK_H_
