// In-process link shaping: a token bucket that paces a sender to a byte rate. The sender calls
// Acquire(n) before putting n bytes on the wire; Acquire sleeps (on the injected Clock) until the
// bucket allows them. A request larger than the burst is allowed to drive the bucket into debt,
// which later requests pay back, so any chunk size works and the long-run rate is exactly `rate`.
//
//   netem::TokenBucket bucket(netem::MbitToBytesPerSecond(100), /*burst_bytes=*/64 << 10);
//   bucket.Acquire(chunk.size());   // then write the chunk
//
// Delay, jitter and loss (as retransmission delay) are the netem issue's; they will sit behind the
// same Acquire-before-send call. Not thread-safe: one sender thread owns a bucket.
#ifndef LONGHAUL_NETEM_SHAPER_H_
#define LONGHAUL_NETEM_SHAPER_H_

#include <cstdint>

#include "absl/time/time.h"
#include "netem/clock.h"

namespace longhaul::netem {

inline double MbitToBytesPerSecond(double mbit) { return mbit * 1e6 / 8.0; }

class TokenBucket {
 public:
  // rate_bytes_per_s <= 0 means unlimited (Acquire never waits). burst_bytes < 1 is taken as 1.
  TokenBucket(double rate_bytes_per_s, int64_t burst_bytes, Clock* clock = RealClock());

  // Waits until `bytes` may be sent and takes them from the bucket. Returns the time waited.
  absl::Duration Acquire(int64_t bytes);

  bool unlimited() const { return rate_ <= 0; }
  double rate_bytes_per_s() const { return rate_; }

 private:
  void Refill();
  double rate_;
  double burst_;
  double tokens_;  // may go negative (debt) after a request larger than the burst
  Clock* clock_;
  absl::Time last_;
};

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_SHAPER_H_
