// In-process link shaping: a token bucket that paces a sender to a byte rate. The sender calls
// Acquire(n) before putting n bytes on the wire; Acquire sleeps (on the injected Clock) until the
// bucket allows them. A request larger than the burst is allowed to drive the bucket into debt,
// which later requests pay back, so any chunk size works and the long-run rate is exactly `rate`.
//
//   netem::TokenBucket bucket(netem::MbitToBytesPerSecond(100), /*burst_bytes=*/64 << 10);
//   bucket.Acquire(chunk.size());   // then write the chunk
//
// LinkShaper adds one-way delay, jitter and loss (as retransmission delay) on top of the rate:
// Admit(n) paces like the bucket and returns when the bytes are delivered at the far end. Not
// thread-safe: one sender thread owns a bucket or a shaper.
#ifndef LONGHAUL_NETEM_SHAPER_H_
#define LONGHAUL_NETEM_SHAPER_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"
#include "common/clock.h"

namespace longhaul::netem {

inline double MbitToBytesPerSecond(double mbit) { return mbit * 1e6 / 8.0; }

class TokenBucket {
 public:
  // rate_bytes_per_s <= 0 means unlimited (Acquire never waits). burst_bytes < 1 is taken as 1.
  TokenBucket(double rate_bytes_per_s, int64_t burst_bytes, common::Clock* clock = common::RealClock());

  // Waits until `bytes` may be sent and takes them from the bucket. Returns the time waited.
  // Emulation: the bytes leave once their time at the rate has passed (the caller writes them after
  // it returns), as from a link that serialises them.
  absl::Duration Acquire(int64_t bytes);
  // Pacing: waits out what earlier requests owe, then takes `bytes` and returns at once, so they
  // leave now and the next request waits for them. Returns the time waited.
  absl::Duration Pace(int64_t bytes);

  bool unlimited() const { return rate_ <= 0; }
  double rate_bytes_per_s() const { return rate_; }

 private:
  void Refill();
  double rate_;
  double burst_;
  double tokens_;  // may go negative (debt) after a request larger than the burst
  common::Clock* clock_;
  absl::Time last_;
};

// The burst both shapers use unless told otherwise (the in-process token bucket and tc tbf): about
// 1 ms of traffic, at least two 1500-byte packets. Small on purpose: a bucket that refills while a
// pipeline link is idle (fill and drain of every step) would otherwise let the next frames through
// for free and overstate what the link delivers.
inline int64_t DefaultBurstBytes(double rate_bytes_per_s) {
  const double ms = rate_bytes_per_s / 1000;
  return ms > 3200 ? static_cast<int64_t>(ms) : 3200;
}

// A link's emulated properties (the job spec's `links:` section).
struct LinkProfile {
  double rate_bytes_per_s = 0;  // <= 0: unlimited
  int64_t burst_bytes = 0;      // token-bucket burst; 0: DefaultBurstBytes(rate)
  absl::Duration delay = absl::ZeroDuration();   // one-way latency
  absl::Duration jitter = absl::ZeroDuration();  // delay varies uniformly in [delay - jitter, delay + jitter]
  double loss = 0;              // probability that a chunk is lost and must be retransmitted
  // Time to notice a loss and retransmit (each further loss of the same chunk adds it again).
  // Zero: max(200 ms, 3 x delay), TCP's minimum RTO or three one-way delays.
  absl::Duration retransmit = absl::ZeroDuration();
  uint64_t seed = 1;            // jitter and loss draws
  // The "0 means default" rules of the two fields above, decided here and nowhere else.
  int64_t EffectiveBurstBytes() const { return burst_bytes > 0 ? burst_bytes : DefaultBurstBytes(rate_bytes_per_s); }
  absl::Duration EffectiveRetransmit() const {
    return retransmit > absl::ZeroDuration() ? retransmit : std::max(absl::Milliseconds(200), 3 * delay);
  }
  bool shaped() const {
    return rate_bytes_per_s > 0 || delay > absl::ZeroDuration() || jitter > absl::ZeroDuration() || loss > 0;
  }
  // Not emulation: the sender's own rate on a real (or tc-shaped) link, each chunk sent as soon as
  // the pace allows (LinkPacer: a token bucket of DefaultBurstBytes; burst_bytes is the emulation's). Kept just
  // under the bottleneck's rate, it keeps that link's queue short, and with it the delay of the ACKs
  // that share the queue (docs/netem-sweep.md, "Paced senders"). Per link, not per host: a host
  // sending on two links at once sends at twice the pace. <= 0: unpaced. An emulated (shaped)
  // profile is not paced as well.
  double pace_bytes_per_s = 0;
  bool paced() const { return !shaped() && pace_bytes_per_s > 0; }
};

// The sender's pacer of a link (LinkProfile::paced): a token bucket at the pace with the default
// burst, used through TokenBucket::Pace; unlimited when the profile is not paced.
inline TokenBucket LinkPacer(const LinkProfile& p, common::Clock* clock = common::RealClock()) {
  const double pace = p.paced() ? p.pace_bytes_per_s : 0;
  return TokenBucket(pace, DefaultBurstBytes(pace), clock);
}

// Delivery schedule of a shaped link. For each chunk the sender calls Admit(bytes): the rate is
// enforced by sleeping on the clock (as TokenBucket::Acquire), and the returned time is when the
// chunk arrives: send time + delay + jitter + one retransmission timeout per loss event. Like TCP,
// the link delivers in order, so a chunk never arrives before the one sent before it (a loss holds
// back everything behind it: head-of-line blocking). The sender keeps the chunk in a delay line
// until then (worker/link_sender.cc), so latency does not reduce throughput.
class LinkShaper {
 public:
  LinkShaper(const LinkProfile& p, common::Clock* clock = common::RealClock());
  absl::Time Admit(int64_t bytes);
  int64_t losses() const { return losses_; }

 private:
  LinkProfile p_;
  common::Clock* clock_;
  TokenBucket bucket_;
  uint64_t draws_ = 0;
  absl::Time last_delivery_ = absl::InfinitePast();
  int64_t losses_ = 0;
  double Uniform();  // [0, 1)
};

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_SHAPER_H_
