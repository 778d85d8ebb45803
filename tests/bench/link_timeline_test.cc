#include "bench/link_timeline.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/read_file.h"

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
  const IdleProfile p = ProfileIdle(s, s.at.front(), s.at.back(), 1000, 0.5, 8);
  EXPECT_NEAR(p.window_s, 11.2, 1e-9);
  EXPECT_NEAR(p.busy_s, 3.9 + 0.07 + 0.15, 1e-9);  // the long gap's trickle (3 bytes a tick) counts busy
  EXPECT_NEAR(p.between_frames_s, 0.2 + 0.03, 1e-9);
  EXPECT_NEAR(p.turns_s, 2.0, 1e-9);
  EXPECT_EQ(p.turns, 1);
  EXPECT_NEAR(p.long_s, 5.0 - 0.15, 1e-9);
  EXPECT_EQ(p.long_gaps, 1);
  EXPECT_NEAR(p.busy_s + p.between_frames_s + p.turns_s + p.long_s, p.window_s, 1e-9);
  // With turns up to 12 frames (6 s), the 5 s gap is a turn too.
  const IdleProfile wide = ProfileIdle(s, s.at.front(), s.at.back(), 1000, 0.5, 12);
  EXPECT_EQ(wide.turns, 2);
  EXPECT_EQ(wide.long_gaps, 0);
}

TEST(ProfileIdleTest, GapsOfExactlyOneFrameAreTurnsAndOfExactlyTheTurnLimitToo) {
  // Frames of 0.2 s: a 0.2 s gap is one frame (a turn), a 1.6 s gap is 8 frames (still a turn).
  std::vector<int64_t> ticks;
  for (const std::vector<int64_t>& part : {Repeat(100, 3), Repeat(0, 2), Repeat(100, 3), Repeat(0, 16), Repeat(100, 3)}) {
    ticks.insert(ticks.end(), part.begin(), part.end());
  }
  const ByteSeries s = Series(ticks);
  const IdleProfile p = ProfileIdle(s, s.at.front(), s.at.back(), 1000, 0.2, 8);
  EXPECT_EQ(p.turns, 2);
  EXPECT_NEAR(p.turns_s, 1.8, 1e-9);
  EXPECT_EQ(p.long_gaps, 0);
  EXPECT_NEAR(p.between_frames_s, 0, 1e-9);
}

TEST(ProfileIdleTest, AGapKeepsItsKindAcrossTheWindowsEdgesAndCountsOnlyItsTimeInside) {
  // 1 s busy, a 3 s gap, 1 s busy, a 3 s gap that the series ends in; frames of 0.1 s, turns up
  // to 8 (0.8 s): both gaps are long. The window starts 1 s into the first gap and ends 1 s into
  // the second.
  std::vector<int64_t> ticks;
  for (const std::vector<int64_t>& part : {Repeat(100, 10), Repeat(0, 30), Repeat(100, 10), Repeat(0, 30)}) {
    ticks.insert(ticks.end(), part.begin(), part.end());
  }
  const ByteSeries s = Series(ticks);
  const absl::Time begin = s.at.front() + absl::Seconds(2), end = s.at.front() + absl::Seconds(6);
  const IdleProfile p = ProfileIdle(s, begin, end, 1000, 0.1, 8);
  EXPECT_NEAR(p.window_s, 4, 1e-9);
  EXPECT_NEAR(p.busy_s, 1, 1e-9);
  EXPECT_NEAR(p.long_s, 3, 1e-9);  // 2 s of the first gap, 1 s of the second
  EXPECT_EQ(p.long_gaps, 2);
  EXPECT_EQ(p.turns, 0);
  EXPECT_NEAR(p.between_frames_s, 0, 1e-9);
}

TEST(ProfileIdleTest, SplitsIntervalsAtTheWindowsEdgesInProportion) {
  const ByteSeries s = Series(Repeat(80, 20));  // 2 s at 80% of the rate: every interval busy
  const absl::Time begin = s.at.front() + absl::Milliseconds(150), end = s.at.front() + absl::Milliseconds(1250);
  const IdleProfile p = ProfileIdle(s, begin, end, 1000, 0.5, 8);
  EXPECT_NEAR(p.window_s, 1.1, 1e-9);
  EXPECT_NEAR(p.busy_s, 0.88, 1e-9);
  EXPECT_NEAR(p.between_frames_s, 0.22, 1e-9);
  EXPECT_EQ(p.turns + p.long_gaps, 0);
}

TEST(ProfileIdleTest, BytesAboveTheRateCarryOverToTheNextInterval) {
  // A sample taken late: 150 bytes in one 0.1 s interval, 50 in the next, at 1,000 bytes/s. The
  // link was busy throughout; without the carry the second interval would be half idle.
  const ByteSeries s = Series({100, 150, 50, 100});
  const IdleProfile p = ProfileIdle(s, s.at.front(), s.at.back(), 1000, 0.5, 8);
  EXPECT_NEAR(p.busy_s, 0.4, 1e-9);
  EXPECT_NEAR(p.between_frames_s + p.turns_s + p.long_s, 0, 1e-9);
}

TEST(ProfileIdleTest, ARateOrFrameOfZeroGivesOnlyTheWindow) {
  const ByteSeries s = Series(Repeat(100, 10));
  for (const auto& [rate, frame] : {std::pair(0.0, 0.5), std::pair(1000.0, 0.0)}) {
    const IdleProfile p = ProfileIdle(s, s.at.front(), s.at.back(), rate, frame, 8);
    EXPECT_NEAR(p.window_s, 1, 1e-9);
    EXPECT_EQ(p.busy_s, 0);
    EXPECT_EQ(p.between_frames_s + p.turns_s + p.long_s, 0);
  }
}

TEST(BusiestLinkIdleTest, TakesTheDirectionWithTheMostBytesInTheWindow) {
  const ByteSeries quiet = Series(Repeat(10, 10)), busy = Series(Repeat(90, 10)), half = Series(Repeat(50, 10));
  const LinkIdle li = BusiestLinkIdle({"w0 (stage 1)", "w1 (stage 0)"}, {quiet, half}, {quiet, busy},
                                      quiet.at.front(), quiet.at.back(), 1000, 0.5, 8);
  EXPECT_EQ(li.link, "w1 (stage 0) down");
  EXPECT_NEAR(li.idle.busy_s, 0.9, 1e-9);
}

TEST(SharesOfTest, DividesByTheWindowAndTheGapsByItsSteps) {
  LinkIdle li{"w1 (stage 1) up", {}};
  li.idle.window_s = 10;
  li.idle.busy_s = 8;
  li.idle.between_frames_s = 0.5;
  li.idle.turns_s = 1;
  li.idle.long_s = 0.5;
  li.idle.turns = 5;
  li.idle.long_gaps = 2;
  const IdleShares s = SharesOf(li, 2);
  EXPECT_EQ(s.link, "w1 (stage 1) up");
  EXPECT_DOUBLE_EQ(s.busy, 0.8);
  EXPECT_DOUBLE_EQ(s.between_frames, 0.05);
  EXPECT_DOUBLE_EQ(s.turns, 0.1);
  EXPECT_DOUBLE_EQ(s.long_gaps, 0.05);
  EXPECT_DOUBLE_EQ(s.turns_per_step, 2.5);
  EXPECT_DOUBLE_EQ(s.long_per_step, 1);
}

TEST(TurnFramesTest, GrowsWithGPipesFillAndDrainPastFiveStages) {
  EXPECT_EQ(TurnFrames(2), 8);
  EXPECT_EQ(TurnFrames(5), 8);
  EXPECT_EQ(TurnFrames(8), 14);
}

TEST(LinkSamplerTest, SamplesADevicesCountersUntilStopped) {
  // This process's own loopback, which every network namespace has.
  absl::StatusOr<std::unique_ptr<LinkSampler>> s =
      LinkSampler::Start({{"self", getpid(), "lo"}}, absl::Milliseconds(2));
  ASSERT_TRUE(s.ok()) << s.status();
  absl::SleepFor(absl::Milliseconds(50));
  (*s)->Stop();
  ASSERT_EQ((*s)->names(), std::vector<std::string>{"self"});
  const ByteSeries& up = (*s)->up()[0];
  ASSERT_GE(up.at.size(), 3u);
  EXPECT_EQ(up.at.size(), up.bytes.size());
  EXPECT_EQ((*s)->down()[0].at.size(), up.at.size());
  for (size_t i = 1; i < up.at.size(); ++i) {
    EXPECT_GT(up.at[i], up.at[i - 1]);
    EXPECT_GE(up.bytes[i], up.bytes[i - 1]);
  }
  (*s)->Stop();  // again: nothing to do
}

TEST(LinkSamplerTest, AHostWhoseCountersCannotBeReadIsNamed) {
  absl::StatusOr<std::unique_ptr<LinkSampler>> s =
      LinkSampler::Start({{"w7", /*pid=*/0x3fffffff}}, absl::Milliseconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("w7"), std::string::npos) << s.status();
  absl::StatusOr<std::unique_ptr<LinkSampler>> no_dev =
      LinkSampler::Start({{"w8", getpid(), "no-such-dev0"}}, absl::Milliseconds(5));
  ASSERT_FALSE(no_dev.ok());
  EXPECT_NE(no_dev.status().message().find("w8"), std::string::npos) << no_dev.status();
  EXPECT_NE(no_dev.status().message().find("no-such-dev0"), std::string::npos) << no_dev.status();
}

TEST(WindowOfTest, TheStepsBetweenTheFirstAndLastEndSeenWhileTheJobRan) {
  const absl::Time t = absl::FromUnixSeconds(1000);
  const std::vector<StepEnd> ends = {{1, t}, {3, t + absl::Seconds(4)}, {4, t + absl::Seconds(6)}};
  const StepWindow w = WindowOf(ends, /*still_running=*/true);
  EXPECT_EQ(w.begin, t);
  EXPECT_EQ(w.end, t + absl::Seconds(6));
  EXPECT_EQ(w.steps, 3);  // polling skipped step 2's end; the steps between are still whole
  EXPECT_EQ(WindowOf(ends, /*still_running=*/false).steps, 0);  // the job ended (or ran past) while watched
  EXPECT_EQ(WindowOf({ends[0]}, true).steps, 0);
  const StepWindow none = WindowOf({}, true);
  EXPECT_EQ(none.steps, 0);
  EXPECT_EQ(none.begin, absl::InfiniteFuture());
}

TEST(AppendLinkTraceTest, WritesAHeaderOnceThenStepsAndSamplesPerJob) {
  const std::string path = ::testing::TempDir() + "/link-trace-test.csv";
  std::remove(path.c_str());
  const absl::Time t = absl::FromUnixSeconds(1000);
  const std::vector<ByteSeries> up = {{{t, t + absl::Milliseconds(5)}, {10, 20}}};
  const std::vector<ByteSeries> down = {{{t, t + absl::Milliseconds(5)}, {30, 45}}};
  ASSERT_TRUE(AppendLinkTrace(path, "300 fp32", 1, {"w1 (stage 0)"}, up, down, {{2, t + absl::Seconds(1)}}).ok());
  ASSERT_TRUE(AppendLinkTrace(path, "300 fp32", 2, {"w1 (stage 0)"}, up, down, {}).ok());
  absl::StatusOr<std::string> text = common::ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "cell,round,kind,host,step,unix_s,up_bytes,down_bytes\n"
            "300 fp32,1,step,,2,1001.000000,,\n"
            "300 fp32,1,link,w1 (stage 0),,1000.000000,10,30\n"
            "300 fp32,1,link,w1 (stage 0),,1000.005000,20,45\n"
            "300 fp32,2,link,w1 (stage 0),,1000.000000,10,30\n"
            "300 fp32,2,link,w1 (stage 0),,1000.005000,20,45\n");
  absl::Status bad = AppendLinkTrace("/nonexistent-dir/trace.csv", "x", 1, {}, {}, {}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.csv"), std::string::npos) << bad;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace longhaul::bench
