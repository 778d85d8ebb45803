// NetworkClaim (netem/tc/claim.h): a topology name claimed by one process at a time, released when
// the claim goes or its process ends, however it ends. Needs no root.
#include "netem/tc/claim.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

  // A child process that claims name_ and holds it until it reads a byte (or end of file) from
  // its release pipe, then ends by _exit without releasing anything itself; or until killed. The
  // parent's Child kills and reaps it, whatever the test's assertions do.
  struct Child {
    pid_t pid = -1;
    int release = -1;  // the release pipe's write end
    void Release() {
      const char go = 'x';
      if (release >= 0) (void)!write(release, &go, 1);
    }
    ~Child() {
      if (release >= 0) close(release);
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  };
  // Whether the child started and claimed the name (it is reaped by ~Child either way).
  bool StartChildHolding(Child* child) {
    int said[2], release[2];
    if (pipe(said) != 0) return false;
    if (pipe(release) != 0) {
      close(said[0]);
      close(said[1]);
      return false;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(said[0]);
      close(release[1]);
      absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
      const char ok = c.ok() ? 'y' : 'n';
      (void)!write(said[1], &ok, 1);
      if (!c.ok()) _exit(1);
      char go;
      (void)!read(release[0], &go, 1);
      _exit(0);
    }
    close(said[1]);
    close(release[0]);
    child->pid = pid;
    child->release = release[1];
    char got = 0;
    const bool claimed = pid > 0 && read(said[0], &got, 1) == 1 && got == 'y';
    close(said[0]);
    return claimed;
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
  EXPECT_TRUE(NetworkClaim::Acquire(name_, absl::ZeroDuration()).ok());
}

TEST_F(NetworkClaimTest, AWaitingClaimGetsItWhenTheHolderEnds) {
  Child child;
  ASSERT_TRUE(StartChildHolding(&child)) << "the child could not claim " << name_;
  // The holder is told to end only once the claim below is waiting for it.
  int64_t told_pid = -1;
  absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::Seconds(60), [&](int64_t pid) {
    told_pid = pid;
    child.Release();
  });
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(told_pid, child.pid);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(NetworkClaimTest, AKilledHolderLeavesNoClaimBehind) {
  Child child;
  ASSERT_TRUE(StartChildHolding(&child)) << "the child could not claim " << name_;
  absl::StatusOr<std::optional<int64_t>> held = NetworkClaim::Holder(name_);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, std::optional<int64_t>(child.pid));
  EXPECT_FALSE(NetworkClaim::Acquire(name_, absl::ZeroDuration()).ok());
  kill(child.pid, SIGKILL);
  ASSERT_EQ(waitpid(child.pid, nullptr, 0), child.pid);
  child.pid = -1;
  absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
  EXPECT_TRUE(c.ok()) << c.status();
}

// The lock directory is every user's and the claimer may be root: a planted link must not get its
// target truncated (or claimed); the error says what is wrong with the file.
TEST_F(NetworkClaimTest, ALockFileThatIsALinkIsRefusedAndItsTargetUntouched) {
  const std::string lock = NetworkClaim::LockPath(name_);
  const std::string target = lock + ".target";
  {
    FILE* f = std::fopen(target.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("precious\n", f);
    std::fclose(f);
  }
  auto target_text = [&target] {
    char buf[64] = {};
    FILE* f = std::fopen(target.c_str(), "r");
    if (f == nullptr) return std::string();
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    return std::string(buf, n);
  };
  ASSERT_EQ(symlink(target.c_str(), lock.c_str()), 0);
  absl::StatusOr<NetworkClaim> c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("symbolic link"), std::string::npos) << c.status();
  EXPECT_FALSE(NetworkClaim::Holder(name_).ok());
  EXPECT_EQ(target_text(), "precious\n");
  ASSERT_EQ(unlink(lock.c_str()), 0);

  ASSERT_EQ(link(target.c_str(), lock.c_str()), 0);  // a second name for the target
  c = NetworkClaim::Acquire(name_, absl::ZeroDuration());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("with one link"), std::string::npos) << c.status();
  EXPECT_EQ(target_text(), "precious\n");
  unlink(target.c_str());
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
