#include "netem/shaper.h"

#include <gtest/gtest.h>

namespace longhaul::netem {
namespace {

// Sends `total` bytes in `chunk`-byte writes through a bucket on a fake clock and returns the rate
// achieved (bytes per fake second).
double AchievedRate(double rate, int64_t burst, int64_t chunk, int64_t total) {
  FakeClock clock;
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
  FakeClock clock;
  TokenBucket b(1000, 5000, &clock);
  EXPECT_EQ(b.Acquire(5000), absl::ZeroDuration());
  EXPECT_EQ(b.Acquire(1000), absl::Seconds(1));
  clock.Advance(absl::Seconds(100));  // idle time refills at most the burst
  EXPECT_EQ(b.Acquire(5000), absl::ZeroDuration());
  EXPECT_EQ(b.Acquire(500), absl::Milliseconds(500));
}

TEST(TokenBucketTest, UnlimitedNeverWaits) {
  FakeClock clock;
  TokenBucket b(0, 0, &clock);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b.Acquire(1 << 30), absl::ZeroDuration());
  EXPECT_EQ(clock.total_slept(), absl::ZeroDuration());
}

}  // namespace
}  // namespace longhaul::netem
