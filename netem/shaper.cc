#include "netem/shaper.h"

#include <algorithm>

namespace longhaul::netem {

TokenBucket::TokenBucket(double rate_bytes_per_s, int64_t burst_bytes, Clock* clock)
    : rate_(rate_bytes_per_s),
      burst_(static_cast<double>(std::max<int64_t>(burst_bytes, 1))),
      tokens_(burst_),
      clock_(clock),
      last_(clock->Now()) {}

void TokenBucket::Refill() {
  const absl::Time now = clock_->Now();
  const double dt = absl::ToDoubleSeconds(now - last_);
  last_ = now;
  if (dt > 0) tokens_ = std::min(burst_, tokens_ + dt * rate_);
}

absl::Duration TokenBucket::Acquire(int64_t bytes) {
  if (unlimited()) return absl::ZeroDuration();
  // Charge first, then wait out the debt: the bytes leave at the rate they are paid for, so the
  // caller's write (which happens after Acquire returns) completes the interval it paid for.
  Refill();
  tokens_ -= static_cast<double>(bytes);
  if (tokens_ >= 0) return absl::ZeroDuration();
  const absl::Duration d = absl::Seconds(-tokens_ / rate_);
  clock_->SleepFor(d);
  Refill();
  // The debt has been slept off; what is left is rounding (or nothing, if the sleep overshot).
  if (tokens_ < 0) tokens_ = 0;
  return d;
}

}  // namespace longhaul::netem
