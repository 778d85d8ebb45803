// common/throttled_log.h: a flood of refusals gives one line per key per period, with the count.
#include "common/throttled_log.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace longhaul::common {
namespace {

TEST(ThrottledLogTest, OneLinePerKeyPerPeriodWithTheCountOfTheRest) {
  FakeClock clock;
  ThrottledLog log("worker w0", absl::Seconds(10), &clock);
  testing::internal::CaptureStderr();
  EXPECT_TRUE(log.Warn("10.0.0.9", "refused a stream from 10.0.0.9"));
  for (int i = 0; i < 99; ++i) EXPECT_FALSE(log.Warn("10.0.0.9", "refused a stream from 10.0.0.9"));
  EXPECT_TRUE(log.Warn("10.0.0.7", "refused a stream from 10.0.0.7"));  // another key is not held back
  clock.Advance(absl::Seconds(10));
  EXPECT_TRUE(log.Warn("10.0.0.9", "refused a stream from 10.0.0.9"));
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;
  EXPECT_TRUE(absl::StrContains(out, "worker w0: warning: refused a stream from 10.0.0.9 (99 more since the last report)"))
      << out;
}

TEST(ThrottledLogTest, KeysPastTheBoundShareOneEntry) {
  FakeClock clock;
  ThrottledLog log("coordinator", absl::Seconds(10), &clock);
  testing::internal::CaptureStderr();
  for (size_t i = 0; i < ThrottledLog::kMaxKeys; ++i) log.Warn(absl::StrCat("host-", i), "x");
  // The table is full of keys logged just now: every new key shares one entry, logged once.
  EXPECT_TRUE(log.Warn("new-1", "y"));
  EXPECT_FALSE(log.Warn("new-2", "y"));
  // Once the old keys are past the period they are forgotten and new keys get their own.
  clock.Advance(absl::Seconds(11));
  EXPECT_TRUE(log.Warn("new-3", "z"));
  EXPECT_TRUE(log.Warn("new-4", "z"));
  testing::internal::GetCapturedStderr();
}

}  // namespace
}  // namespace longhaul::common
