#include "netem/shaper.h"

#include <gtest/gtest.h>

namespace longhaul::netem {
namespace {

// Sends `total` bytes in `chunk`-byte writes through a bucket on a fake clock and returns the rate
// achieved (bytes per fake second).
double AchievedRate(double rate, int64_t burst, int64_t chunk, int64_t total) {
  common::FakeClock clock;
  TokenBucket b(rate, burst, &clock);
  const absl::Time t0 = clock.Now();
  for (int64_t sent = 0; sent < total; sent += chunk) b.Acquire(chunk);
  return static_cast<double>(total) / absl::ToDoubleSeconds(clock.Now() - t0);
}

TEST(TokenBucketTest, DeliversBetweenNinetyAndHundredPercentOfTheRate) {
  const double r = MbitToBytesPerSecond(100);
  for (int64_t chunk : {int64_t{1500}, int64_t{64} << 10, int64_t{1} << 20, int64_t{3} << 20}) {
    const double got = AchievedRate(r, 64 << 10, chunk, int64_t{200} << 20);
    EXPECT_GE(got, 0.9 * r) << "chunk " << chunk;
    EXPECT_LE(got, 1.0 * r * 1.001) << "chunk " << chunk;
  }
}

TEST(TokenBucketTest, BurstIsFreeThenRateApplies) {
  common::FakeClock clock;
  TokenBucket b(1000, 5000, &clock);
  EXPECT_EQ(b.Acquire(5000), absl::ZeroDuration());
  EXPECT_EQ(b.Acquire(1000), absl::Seconds(1));
  clock.Advance(absl::Seconds(100));  // idle time refills at most the burst
  EXPECT_EQ(b.Acquire(5000), absl::ZeroDuration());
  EXPECT_EQ(b.Acquire(500), absl::Milliseconds(500));
}

// Pacing sends a request at once and makes the next one wait for it (Acquire makes the request
// itself wait: emulation); over many requests both keep the rate.
TEST(TokenBucketTest, PaceSendsNowAndTheNextRequestWaits) {
  common::FakeClock clock;
  TokenBucket b(1000, 100, &clock);
  EXPECT_EQ(b.Pace(2000), absl::ZeroDuration());  // into debt, but it leaves now
  EXPECT_EQ(b.Pace(500), absl::Seconds(2) - absl::Milliseconds(100));  // the debt, less the burst it had
  EXPECT_EQ(b.Pace(500), absl::Milliseconds(500));
  clock.Advance(absl::Seconds(100));  // idle time refills at most the burst: nothing is owed
  EXPECT_EQ(b.Pace(5000), absl::ZeroDuration());
  const absl::Time t0 = clock.Now();
  for (int i = 0; i < 100; ++i) b.Pace(1000);
  // 100 requests of a second each at the rate, the first after the 4.9 s still owed.
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(4.9 + 99));
}

TEST(TokenBucketTest, UnlimitedNeverWaits) {
  common::FakeClock clock;
  TokenBucket b(0, 0, &clock);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(b.Acquire(1 << 30), absl::ZeroDuration());
    EXPECT_EQ(b.Pace(1 << 30), absl::ZeroDuration());
  }
  EXPECT_EQ(clock.total_slept(), absl::ZeroDuration());
}

}  // namespace
}  // namespace longhaul::netem

namespace longhaul::netem {
namespace {

TEST(LinkShaperTest, DelayAndJitterStayInTheirBoundsAndDeliveryIsInOrder) {
  common::FakeClock clock;
  LinkProfile p;
  p.delay = absl::Milliseconds(40);
  p.jitter = absl::Milliseconds(10);
  p.seed = 3;
  LinkShaper s(p, &clock);
  absl::Time last = absl::InfinitePast();
  absl::Duration lo = absl::InfiniteDuration(), hi = -absl::InfiniteDuration();
  for (int i = 0; i < 5000; ++i) {
    clock.Advance(absl::Milliseconds(5));
    const absl::Time sent = clock.Now();
    const absl::Time at = s.Admit(1000);
    EXPECT_GE(at, last) << "chunk " << i << " overtook the one before";
    last = at;
    lo = std::min(lo, at - sent);
    hi = std::max(hi, at - sent);
  }
  EXPECT_GE(lo, absl::Milliseconds(30));
  EXPECT_LE(hi, absl::Milliseconds(50));
  EXPECT_LT(lo, absl::Milliseconds(32)) << "jitter should reach near its lower bound";
  EXPECT_GT(hi, absl::Milliseconds(48)) << "and near its upper bound";
}

TEST(LinkShaperTest, LossAddsRetransmissionDelayAtTheConfiguredRate) {
  common::FakeClock clock;
  LinkProfile p;
  p.delay = absl::Milliseconds(20);
  p.loss = 0.05;
  p.seed = 9;
  LinkShaper s(p, &clock);
  const int n = 20000;
  int delayed = 0;
  for (int i = 0; i < n; ++i) {
    clock.Advance(absl::Seconds(1));  // far apart: no head-of-line blocking between chunks
    const absl::Time sent = clock.Now();
    const absl::Duration d = s.Admit(100) - sent;
    EXPECT_TRUE(d == absl::Milliseconds(20) || d >= absl::Milliseconds(220)) << absl::FormatDuration(d);
    delayed += d > absl::Milliseconds(20);
  }
  // Default retransmission timeout: max(200 ms, 3 x delay). Binomial(20000, 0.05): sd ~ 31.
  EXPECT_NEAR(delayed, 0.05 * n, 150);
  EXPECT_GE(s.losses(), delayed);
}

TEST(LinkShaperTest, ALossHoldsBackTheChunksBehindIt) {
  common::FakeClock clock;
  LinkProfile p;
  p.delay = absl::Milliseconds(10);
  p.loss = 0.5;
  p.retransmit = absl::Milliseconds(300);
  LinkShaper s(p, &clock);
  absl::Time prev = absl::InfinitePast();
  bool blocked = false;
  for (int i = 0; i < 200; ++i) {
    clock.Advance(absl::Milliseconds(1));
    const absl::Time at = s.Admit(10);
    if (at > clock.Now() + absl::Milliseconds(10) && at == prev) blocked = true;
    EXPECT_GE(at, prev);
    prev = at;
  }
  EXPECT_TRUE(blocked) << "some chunk should have waited behind a retransmitted one";
}

TEST(LinkShaperTest, RateStillHoldsWithDelay) {
  common::FakeClock clock;
  LinkProfile p;
  p.rate_bytes_per_s = MbitToBytesPerSecond(50);
  p.burst_bytes = 64 << 10;
  p.delay = absl::Milliseconds(30);
  LinkShaper s(p, &clock);
  const absl::Time t0 = clock.Now();
  absl::Time last;
  const int64_t chunk = 1 << 20, total = int64_t{100} << 20;
  for (int64_t sent = 0; sent < total; sent += chunk) last = s.Admit(chunk);
  // Delivered rate over the whole transfer (latency included once).
  const double rate = total / absl::ToDoubleSeconds(last - t0 - absl::Milliseconds(30));
  EXPECT_GE(rate, 0.9 * p.rate_bytes_per_s);
  EXPECT_LE(rate, 1.001 * p.rate_bytes_per_s);
}

}  // namespace
}  // namespace longhaul::netem
