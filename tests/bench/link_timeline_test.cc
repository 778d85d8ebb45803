#include "bench/link_timeline.h"

#include <gtest/gtest.h>

namespace longhaul::bench {
namespace {

constexpr char kNetDev[] =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier "
    "compressed\n"
    "    lo:    1234      10    0    0    0     0          0         0     1234      10    0    0    0     0       0"
    "          0\n"
    "  eth0: 987654321 700000    0    0    0     0          0         0 123456789  90000    0    0    0     0       0"
    "          0\n";

TEST(ParseNetDevTest, TakesTheDevicesReceiveAndTransmitBytes) {
  absl::StatusOr<DevBytes> b = ParseNetDev(kNetDev, "eth0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rx, 987654321);
  EXPECT_EQ(b->tx, 123456789);
  absl::StatusOr<DevBytes> lo = ParseNetDev(kNetDev, "lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(lo->rx, 1234);
}

TEST(ParseNetDevTest, AMissingDeviceOrAShortLineIsAnErrorNamingIt) {
  absl::StatusOr<DevBytes> none = ParseNetDev(kNetDev, "eth1");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("eth1"), std::string::npos) << none.status();
  absl::StatusOr<DevBytes> short_line = ParseNetDev("  eth0: 1 2 3\n", "eth0");
  ASSERT_FALSE(short_line.ok());
  EXPECT_NE(short_line.status().message().find("malformed"), std::string::npos) << short_line.status();
  EXPECT_FALSE(ParseNetDev("  eth0: x 0 0 0 0 0 0 0 5 0 0 0 0 0 0 0\n", "eth0").ok());
}

// A series sampled every 0.1 s at 1,000 bytes/s: `per_tick` bytes in each interval.
ByteSeries Series(const std::vector<int64_t>& per_tick) {
  ByteSeries s;
  const absl::Time t0 = absl::UnixEpoch();
  int64_t total = 0;
  s.at.push_back(t0);
  s.bytes.push_back(0);
  for (size_t i = 0; i < per_tick.size(); ++i) {
    total += per_tick[i];
    s.at.push_back(t0 + absl::Milliseconds(100) * static_cast<int64_t>(i + 1));
    s.bytes.push_back(total);
  }
  return s;
}

std::vector<int64_t> Repeat(int64_t bytes, int n) { return std::vector<int64_t>(static_cast<size_t>(n), bytes); }

TEST(ProfileIdleTest, SortsTheIdleTimeByGapLengthInFrames) {
  // 1 s busy, a 0.2 s gap, 1 s busy, a 2 s gap, 1 s busy, a 5 s gap, 1 s of which one interval
  // is 70% busy; frames of 0.5 s: 0.2 s is between frames, 2 s a turn (up to 8 frames = 4 s), 5 s long.
  std::vector<int64_t> ticks;
  for (const std::vector<int64_t>& part : {Repeat(100, 10), Repeat(0, 2), Repeat(100, 10), Repeat(0, 20),
                                           Repeat(100, 10), Repeat(3, 50), Repeat(100, 9), Repeat(70, 1)}) {
    ticks.insert(ticks.end(), part.begin(), part.end());
  }
  const ByteSeries s = Series(ticks);
  const IdleProfile p = ProfileIdle(s, s.at.front(), s.at.back(), 1000, 0.5);
  EXPECT_NEAR(p.window_s, 11.2, 1e-9);
  EXPECT_NEAR(p.busy_s, 3.9 + 0.07 + 0.15, 1e-9);  // the long gap's trickle (3 bytes a tick) counts busy
  EXPECT_NEAR(p.between_frames_s, 0.2 + 0.03, 1e-9);
  EXPECT_NEAR(p.turns_s, 2.0, 1e-9);
  EXPECT_EQ(p.turns, 1);
  EXPECT_NEAR(p.long_s, 5.0 - 0.15, 1e-9);
  EXPECT_EQ(p.long_gaps, 1);
  EXPECT_NEAR(p.busy_s + p.between_frames_s + p.turns_s + p.long_s, p.window_s, 1e-9);
}

TEST(ProfileIdleTest, CountsOnlyTheWindowAndSplitsIntervalsAtItsEdges) {
  const ByteSeries s = Series(Repeat(100, 20));  // 2 s, always busy
  const absl::Time begin = s.at.front() + absl::Milliseconds(150), end = s.at.front() + absl::Milliseconds(1250);
  const IdleProfile p = ProfileIdle(s, begin, end, 1000, 0.5);
  EXPECT_NEAR(p.window_s, 1.1, 1e-9);
  EXPECT_NEAR(p.busy_s, 1.1, 1e-9);
  EXPECT_EQ(p.turns + p.long_gaps, 0);
  // A rate or frame of zero profiles nothing rather than dividing by it.
  EXPECT_EQ(ProfileIdle(s, begin, end, 0, 0.5).busy_s, 0);
}

TEST(LinkSamplerTest, AHostWhoseCountersCannotBeReadIsNamed) {
  absl::StatusOr<std::unique_ptr<LinkSampler>> s =
      LinkSampler::Start({{"w7", /*pid=*/0x3fffffff}}, absl::Milliseconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("w7"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace longhaul::bench
