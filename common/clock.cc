#include "common/clock.h"

namespace longhaul::common {
namespace {

class Real : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* RealClock() {
  static Clock* const clock = new Real();
  return clock;
}

absl::Time FakeClock::Now() {
  absl::MutexLock l(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock l(&mu_);
  if (d > absl::ZeroDuration()) {
    now_ += d;
    slept_ += d;
  }
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock l(&mu_);
  now_ += d;
}

absl::Duration FakeClock::total_slept() {
  absl::MutexLock l(&mu_);
  return slept_;
}

}  // namespace longhaul::common
