// End-to-end scheduling and state-file ownership: real coordinator and worker processes on
// loopback (ctest label: integration). The queue's rule is coordinator/scheduler.h's.
#include <signal.h>

#include <functional>
#include <tuple>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

// A small model so that each job runs in seconds on 2 cores.
std::string Spec(const std::string& name, int stages, int steps) {
  return absl::StrCat("name: ", name, R"(
model: {layers: 4, hidden: 64, heads: 4, context: 32}
stages: )", stages, R"(
micro_batches: 2
micro_batch_size: 2
codecs: {forward: "int8", backward: "int8"}
steps: )", steps, "\nseed: 7\n");
}

class SchedulingTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  // Polls the job until `done` holds (or the time is up); returns its last status.
  absl::StatusOr<v1::JobStatus> WaitFor(uint64_t job, const std::function<bool(const v1::JobStatus&)>& done,
                                        absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    for (;;) {
      absl::StatusOr<v1::JobStatus> st = c_.Get(job);
      if (!st.ok() || done(*st) || absl::Now() > end) return st;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  std::pair<int, std::string> Ctl(const std::string& args) {
    return Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " ", args));
  }
  Cluster c_;
};

TEST_F(SchedulingTest, AJobTooBigForTheClusterDoesNotHoldBackASmallOne) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> big = c_.Submit(Spec("big", 3, 3));
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<uint64_t> small = c_.Submit(Spec("small", 1, 3));
  ASSERT_TRUE(small.ok()) << small.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*small, absl::Minutes(2));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();

  absl::StatusOr<v1::JobStatus> b = c_.Get(*big);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->state(), v1::JOB_STATE_PENDING);
  const std::string why = "needs 3 workers, only 2 live";
  EXPECT_NE(b->pending_reason().find(why), std::string::npos) << b->pending_reason();
  // The CLI shows why, in the table and in the job's detail.
  auto [rc, table] = Ctl("status");
  EXPECT_EQ(rc, 0) << table;
  EXPECT_NE(table.find("PENDING"), std::string::npos) << table;
  EXPECT_NE(table.find(why), std::string::npos) << table;
  auto [rc2, detail] = Ctl(absl::StrCat("status ", *big));
  EXPECT_EQ(rc2, 0) << detail;
  EXPECT_NE(detail.find(absl::StrCat("pending: ", why)), std::string::npos) << detail;

  auto [rc3, out] = Ctl(absl::StrCat("cancel ", *big));
  EXPECT_EQ(rc3, 0) << out;
  b = c_.Get(*big);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->state(), v1::JOB_STATE_CANCELLED);
}

// With --reserve-after=1s a pending job soon holds back the jobs behind it; cancelling it lets
// the next one start.
TEST_F(SchedulingTest, CancellingAPendingJobLetsTheNextStart) {
  c_.SetCoordinatorFlags({"--reserve-after=1s"});
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> busy = c_.Submit(Spec("busy", 1, 100000));
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(c_.WaitForStep(*busy, 1, absl::Minutes(1)).ok());
  absl::StatusOr<uint64_t> pair = c_.Submit(Spec("pair", 2, 3));
  ASSERT_TRUE(pair.ok()) << pair.status();
  absl::StatusOr<v1::JobStatus> p = WaitFor(
      *pair, [](const v1::JobStatus& s) { return s.pending_reason().find("waited longer") != std::string::npos; },
      absl::Seconds(20));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->state(), v1::JOB_STATE_PENDING);
  ASSERT_NE(p->pending_reason().find("waited longer than 1s"), std::string::npos) << p->pending_reason();

  absl::StatusOr<uint64_t> next = c_.Submit(Spec("next", 1, 3));
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<v1::JobStatus> n = c_.Get(*next);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->state(), v1::JOB_STATE_PENDING);  // one worker is idle, but the pair has the first claim
  EXPECT_NE(n->pending_reason().find(absl::StrCat("held behind job ", *pair)), std::string::npos) << n->pending_reason();

  auto [rc, out] = Ctl(absl::StrCat("cancel ", *pair));
  EXPECT_EQ(rc, 0) << out;
  n = c_.WaitForEnd(*next, absl::Minutes(2));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->state(), v1::JOB_STATE_SUCCEEDED) << n->error();
  absl::StatusOr<v1::JobStatus> b = c_.Get(*busy);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->state(), v1::JOB_STATE_RUNNING);
  std::tie(rc, out) = Ctl(absl::StrCat("cancel ", *busy));
  EXPECT_EQ(rc, 0) << out;
}

// One coordinator per state file: a second one is refused, naming the file and the holder; a
// holder killed with SIGKILL leaves a file the next coordinator opens, with every job in it.
TEST_F(SchedulingTest, ASecondCoordinatorOnTheSameStateFileIsRefused) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec("waits", 2, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string state = absl::StrCat(c_.dir(), "/coordinator.db");
  // `timeout`: a second coordinator that did start must not hang the test.
  auto [rc, out] = Cluster::Run(absl::StrCat("timeout 20 ", Cluster::Bin("longhaul-coordinator"),
                                             " --listen=127.0.0.1:0 --state=", state, " 2>&1"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find(absl::StrCat("state file ", state, " is in use by another coordinator (pid ",
                                  c_.coordinator()->pid())),
            std::string::npos)
      << out;

  c_.coordinator()->Signal(SIGKILL);
  ASSERT_EQ(c_.coordinator()->Wait(absl::Seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(c_.StartCoordinator().ok());
  absl::StatusOr<v1::JobStatus> st = c_.Get(*job);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(st->name(), "waits");
  EXPECT_NE(st->pending_reason().find("needs 2 workers, only 0 live"), std::string::npos) << st->pending_reason();
}

TEST(CoordinatorFlagsTest, HeartbeatTimeoutMustExceedTheInterval) {
  // `timeout`: should the flags be accepted, the coordinator must not hang the test.
  auto [rc, out] = Cluster::Run(absl::StrCat("timeout 20 ", Cluster::Bin("longhaul-coordinator"),
                                             " --heartbeat-interval=2s --heartbeat-timeout=1500ms 2>&1"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--heartbeat-timeout (1.5s) must be longer than --heartbeat-interval (2s)"), std::string::npos)
      << out;
  std::tie(rc, out) =
      Cluster::Run(absl::StrCat("timeout 20 ", Cluster::Bin("longhaul-coordinator"), " --heartbeat-timeout=soon 2>&1"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("is not a duration"), std::string::npos) << out;
}

}  // namespace
}  // namespace longhaul::cluster
