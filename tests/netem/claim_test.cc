// NetworkClaim (netem/tc/claim.h): a topology name claimed by one process at a time, released when
// the claim goes or its process ends, however it ends. Needs no root.
#include "netem/tc/claim.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace longhaul::netem {
namespace {

class NetworkClaimTest : public ::testing::Test {
 protected:
  // Per test and process, so that concurrent runs of this test do not meet.
  const std::string name_ =
      absl::StrCat("test-", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", getpid());
  void TearDown() override { unlink(NetworkClaim::LockPath(name_).c_str()); }

  // A child process that claims name_, says so through a pipe, and then ends after `hold` (by
  // _exit, without releasing anything itself) or waits to be killed (hold infinite).
  pid_t ChildHolding(absl::Duration hold) {
    int p[2];
    if (pipe(p) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
      const char ok = c.ok() ? 'y' : 'n';
      (void)!write(p[1], &ok, 1);
      if (hold == absl::InfiniteDuration()) {
        for (;;) pause();
      }
      absl::SleepFor(hold);
      _exit(0);
    }
    close(p[1]);
    char got = 0;
    const bool read_one = pid > 0 && read(p[0], &got, 1) == 1;
    close(p[0]);
    EXPECT_TRUE(read_one && got == 'y') << "the child could not claim " << name_;
    return pid;
  }
};

TEST_F(NetworkClaimTest, OneHolderAtATimeWhichOthersSeeByPid) {
  absl::StatusOr<std::optional<int64_t>> before = NetworkClaim::Holder(name_);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->has_value());

  std::optional<NetworkClaim> first;
  {
    absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
    ASSERT_TRUE(c.ok()) << c.status();
    first.emplace(*std::move(c));
  }
  absl::StatusOr<std::optional<int64_t>> held = NetworkClaim::Holder(name_);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, std::optional<int64_t>(getpid()));
  absl::Status unclaimed = NetworkClaim::CheckUnclaimed(name_);
  EXPECT_EQ(unclaimed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unclaimed.message().find(absl::StrCat("in use by process ", getpid())), std::string::npos) << unclaimed;

  // A second claim (another open file: as another process's would be) waits, then names the holder.
  int waits = 0;
  int64_t told_pid = -1;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<NetworkClaim> second = NetworkClaim::Acquire(name_, absl::Milliseconds(300), [&](int64_t pid) {
    ++waits;
    told_pid = pid;
  });
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(300));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(absl::StrCat("in use by process ", getpid())), std::string::npos)
      << second.status();
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(told_pid, getpid());

  first.reset();
  held = NetworkClaim::Holder(name_);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->has_value()) << "released with the claim";
  EXPECT_TRUE(NetworkClaim::CheckUnclaimed(name_).ok());
  EXPECT_TRUE(NetworkClaim::Acquire(name_, absl::ZeroDuration()).ok());
}

TEST_F(NetworkClaimTest, AWaitingClaimGetsItWhenTheHolderEnds) {
  const pid_t child = ChildHolding(absl::Milliseconds(300));
  ASSERT_GT(child, 0);
  int64_t told_pid = -1;
  absl::StatusOr<NetworkClaim> c =
      NetworkClaim::Acquire(name_, absl::Seconds(20), [&](int64_t pid) { told_pid = pid; });
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(told_pid, child);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
}

TEST_F(NetworkClaimTest, AKilledHolderLeavesNoClaimBehind) {
  const pid_t child = ChildHolding(absl::InfiniteDuration());
  ASSERT_GT(child, 0);
  absl::StatusOr<std::optional<int64_t>> held = NetworkClaim::Holder(name_);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, std::optional<int64_t>(child));
  EXPECT_FALSE(NetworkClaim::Acquire(name_, absl::ZeroDuration()).ok());
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST_F(NetworkClaimTest, NamesThatCannotNameAFileAreRejected) {
  for (const char* bad : {"", "a/b", ".."}) {
    absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(bad, absl::ZeroDuration());
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(NetworkClaim::Holder(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace longhaul::netem
