#include "coordinator/store.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace longhaul::coordinator {
namespace {

std::string TempPath() {
  char tmpl[] = "/tmp/longhaul-store-XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  std::remove(tmpl);
  return tmpl;
}

// The state file and what SQLite and the lock leave next to it.
void RemoveStateFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
}

TEST(StoreTest, JobsLossesAndWorkersSurviveReopen) {
  const std::string path = TempPath();
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    v1::JobStatus j;
    j.set_job_id(7);
    j.set_name("seven");
    j.set_state(v1::JOB_STATE_RUNNING);
    j.mutable_spec()->set_steps(10);
    ASSERT_TRUE((*s)->PutJob(j).ok());
    j.set_state(v1::JOB_STATE_SUCCEEDED);  // an update replaces the row
    ASSERT_TRUE((*s)->PutJob(j).ok());
    ASSERT_TRUE((*s)->AppendLoss(7, 2, 2.5).ok());
    ASSERT_TRUE((*s)->AppendLoss(7, 1, 3.5).ok());
    v1::WorkerStatus w;
    w.set_worker_id(3);
    w.mutable_info()->set_name("w3");
    w.set_state(v1::WORKER_STATE_IDLE);
    ASSERT_TRUE((*s)->PutWorker(w).ok());
  }
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto jobs = (*s)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].name(), "seven");
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ((*jobs)[0].spec().steps(), 10);
  auto losses = (*s)->Losses(7);
  ASSERT_TRUE(losses.ok());
  EXPECT_EQ(*losses, (std::vector<double>{3.5, 2.5}));  // ordered by step
  auto workers = (*s)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].info().name(), "w3");
  s->reset();
  RemoveStateFiles(path);
}

TEST(StoreTest, NotADatabaseIsAClearError) {
  const std::string path = TempPath();
  std::ofstream(path) << "this is not an sqlite file, just some text that is long enough to have a header";
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status();
  RemoveStateFiles(path);
}

TEST(StoreTest, UnwritableDirectoryIsAClearError) {
  auto s = Store::Open("/nonexistent-dir/longhaul.db");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot open state file"), std::string::npos) << s.status();
}

TEST(StoreTest, SecondOpenOfTheSameFileIsRefusedNamingFileAndHolder) {
  const std::string path = TempPath();
  {
    auto first = Store::Open(path);
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = Store::Open(path);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string msg(second.status().message());
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(absl::StrCat("pid ", getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find("another coordinator"), std::string::npos) << msg;
  }
  // Released with the Store.
  auto again = Store::Open(path);
  EXPECT_TRUE(again.ok()) << again.status();
  again->reset();
  RemoveStateFiles(path);
}

TEST(StoreTest, FileIsInWalModeAndTransactionsNest) {
  const std::string path = TempPath();
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto mode = (*s)->JournalMode();
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, "wal");
  v1::JobStatus j;
  j.set_job_id(1);
  ASSERT_TRUE((*s)->Begin().ok());
  ASSERT_TRUE((*s)->Begin().ok());  // joins the outer one
  ASSERT_TRUE((*s)->PutJob(j).ok());
  ASSERT_TRUE((*s)->Commit().ok());
  ASSERT_TRUE((*s)->AppendLoss(1, 1, 2.0).ok());
  ASSERT_TRUE((*s)->Commit().ok());
  EXPECT_FALSE((*s)->Commit().ok());  // unbalanced
  auto jobs = (*s)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
  s->reset();
  RemoveStateFiles(path);
}

// kill -9 in the middle of a transaction: the file keeps everything committed before it and
// nothing of it, and the dead process's lock does not stop the next one.
TEST(StoreTest, KilledInsideATransactionLeavesTheFileConsistentAndUnlocked) {
  const std::string path = TempPath();
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    v1::JobStatus j;
    j.set_job_id(1);
    j.set_state(v1::JOB_STATE_PENDING);
    ASSERT_TRUE((*s)->PutJob(j).ok());
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto s = Store::Open(path);
    if (!s.ok()) _exit(3);
    v1::JobStatus j;
    j.set_job_id(1);
    j.set_state(v1::JOB_STATE_RUNNING);
    v1::WorkerStatus w;
    w.set_worker_id(1);
    w.mutable_info()->set_name("w1");
    w.set_state(v1::WORKER_STATE_BUSY);
    if (!(*s)->Begin().ok() || !(*s)->PutJob(j).ok() || !(*s)->PutWorker(w).ok()) _exit(4);
    raise(SIGKILL);  // before Commit
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child exit " << WEXITSTATUS(status);
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto jobs = (*s)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_PENDING);
  auto workers = (*s)->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_TRUE(workers->empty());
  s->reset();
  RemoveStateFiles(path);
}

}  // namespace
}  // namespace longhaul::coordinator
