#include "netem/shaper.h"

#include <algorithm>

namespace longhaul::netem {

TokenBucket::TokenBucket(double rate_bytes_per_s, int64_t burst_bytes, common::Clock* clock)
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

absl::Duration TokenBucket::Pace(int64_t bytes) {
  if (unlimited()) return absl::ZeroDuration();
  Refill();
  absl::Duration d = absl::ZeroDuration();
  if (tokens_ < 0) {
    d = absl::Seconds(-tokens_ / rate_);
    clock_->SleepFor(d);
    Refill();
    if (tokens_ < 0) tokens_ = 0;  // rounding, or nothing if the sleep overshot
  }
  tokens_ -= static_cast<double>(bytes);
  return d;
}

LinkShaper::LinkShaper(const LinkProfile& p, common::Clock* clock)
    : p_(p), clock_(clock), bucket_(p.rate_bytes_per_s, p.EffectiveBurstBytes(), clock) {
  p_.retransmit = p.EffectiveRetransmit();
}

double LinkShaper::Uniform() {
  // SplitMix64 over (seed, draw counter): reproducible for a given seed.
  uint64_t z = p_.seed * 0x9e3779b97f4a7c15ull + (++draws_) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

absl::Time LinkShaper::Admit(int64_t bytes) {
  bucket_.Acquire(bytes);
  absl::Time t = clock_->Now() + p_.delay;
  if (p_.jitter > absl::ZeroDuration()) t += (2 * Uniform() - 1) * p_.jitter;
  if (p_.loss > 0) {
    // Each transmission is lost with probability `loss`; cap the streak so a loss of 1.0 (a dead
    // link) still yields a finite time.
    for (int i = 0; i < 64 && Uniform() < p_.loss; ++i) {
      t += p_.retransmit;
      ++losses_;
    }
  }
  if (t < last_delivery_) t = last_delivery_;  // in-order delivery
  last_delivery_ = t;
  return t;
}

}  // namespace longhaul::netem
