#include "coordinator/store.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

namespace longhaul::coordinator {
namespace {

std::string TempPath() {
  char tmpl[] = "/tmp/longhaul-store-XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  std::remove(tmpl);
  return tmpl;
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
  std::remove(path.c_str());
}

TEST(StoreTest, NotADatabaseIsAClearError) {
  const std::string path = TempPath();
  std::ofstream(path) << "this is not an sqlite file, just some text that is long enough to have a header";
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status();
  std::remove(path.c_str());
}

TEST(StoreTest, UnwritableDirectoryIsAClearError) {
  auto s = Store::Open("/nonexistent-dir/longhaul.db");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot open state file"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace longhaul::coordinator
