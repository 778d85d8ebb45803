// The coordinator's state machine with a fake clock, calling the service methods directly (no
// network): heartbeat timeouts, admission, cancellation, and what a restart does to persisted jobs.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

namespace longhaul::coordinator {
namespace {

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/longhaul-coord-XXXXXX";
    close(mkstemp(tmpl));
    path_ = tmpl;
    std::remove(path_.c_str());
    Open();
  }
  void TearDown() override {
    svc_.reset();
    std::remove(path_.c_str());
  }
  void Open() {
    svc_.reset();
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(10);
    o.clock = &clock_;
    auto svc = CoordinatorService::Create(std::move(*store), o);
    ASSERT_TRUE(svc.ok()) << svc.status();
    svc_ = std::move(*svc);
  }
  uint64_t RegisterWorker(const std::string& name) {
    v1::RegisterRequest req;
    req.mutable_info()->set_name(name);
    req.mutable_info()->set_address("127.0.0.1:9");
    v1::RegisterResponse resp;
    EXPECT_TRUE(svc_->Register(nullptr, &req, &resp).ok());
    return resp.worker_id();
  }
  std::vector<v1::WorkerStatus> Workers() {
    v1::ListWorkersResponse r;
    EXPECT_TRUE(svc_->ListWorkers(nullptr, nullptr, &r).ok());
    return {r.workers().begin(), r.workers().end()};
  }
  v1::JobStatus Job(uint64_t id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::JobStatus st;
    EXPECT_TRUE(svc_->GetJob(nullptr, &req, &st).ok());
    return st;
  }

  common::FakeClock clock_;
  std::string path_;
  std::unique_ptr<CoordinatorService> svc_;
};

TEST_F(CoordinatorTest, MissedHeartbeatsMarkAWorkerDead) {
  const uint64_t id = RegisterWorker("w0");
  clock_.Advance(absl::Seconds(9));
  svc_->CheckHeartbeats();
  EXPECT_EQ(Workers()[0].state(), v1::WORKER_STATE_IDLE);
  clock_.Advance(absl::Seconds(2));
  svc_->CheckHeartbeats();
  const v1::WorkerStatus w = Workers()[0];
  EXPECT_EQ(w.worker_id(), id);
  EXPECT_EQ(w.state(), v1::WORKER_STATE_DEAD);
  EXPECT_NE(w.note().find("no heartbeat for 11s"), std::string::npos) << w.note();
  // It may come back under the same name and keeps its id.
  EXPECT_EQ(RegisterWorker("w0"), id);
}

TEST_F(CoordinatorTest, DuplicateLiveNameIsRefused) {
  RegisterWorker("w0");
  v1::RegisterRequest req;
  req.mutable_info()->set_name("w0");
  req.mutable_info()->set_address("127.0.0.1:10");
  v1::RegisterResponse resp;
  grpc::Status s = svc_->Register(nullptr, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
}

TEST_F(CoordinatorTest, JobsWaitForWorkersAndCanBeCancelled) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml("name: waits\nstages: 2\nmodel: {layers: 2}\nsteps: 5\n");
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
  // Registered workers without an open session are not placeable.
  RegisterWorker("a");
  RegisterWorker("b");
  EXPECT_EQ(Job(resp.job_id()).state(), v1::JOB_STATE_PENDING);
  v1::CancelJobRequest c;
  c.set_job_id(resp.job_id());
  v1::CancelJobResponse cr;
  ASSERT_TRUE(svc_->CancelJob(nullptr, &c, &cr).ok());
  EXPECT_EQ(Job(resp.job_id()).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(svc_->CancelJob(nullptr, &c, &cr).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  c.set_job_id(12345);
  EXPECT_EQ(svc_->CancelJob(nullptr, &c, &cr).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorTest, RestartKeepsJobsAndFailsTheOnesThatWereRunning) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml("name: kept\nsteps: 5\n");
  v1::SubmitJobResponse pending;
  ASSERT_TRUE(svc_->SubmitJob(nullptr, &req, &pending).ok());
  RegisterWorker("w0");
  svc_.reset();
  {  // Simulate a job that was running when the coordinator died.
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok());
    v1::JobStatus running;
    running.set_job_id(50);
    running.set_name("was-running");
    running.set_state(v1::JOB_STATE_RUNNING);
    ASSERT_TRUE((*store)->PutJob(running).ok());
  }
  Open();
  EXPECT_EQ(Job(pending.job_id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(pending.job_id()).name(), "kept");
  const v1::JobStatus r = Job(50);
  EXPECT_EQ(r.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(r.error().find("coordinator restarted"), std::string::npos);
  ASSERT_EQ(Workers().size(), 1u);
  EXPECT_EQ(Workers()[0].state(), v1::WORKER_STATE_DEAD);
  // New ids continue after the persisted ones.
  v1::SubmitJobResponse next;
  ASSERT_TRUE(svc_->SubmitJob(nullptr, &req, &next).ok());
  EXPECT_EQ(next.job_id(), 51u);
}

TEST_F(CoordinatorTest, InvalidSpecIsInvalidArgument) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml("stages: 0\nschedule: nope\n");
  v1::SubmitJobResponse resp;
  grpc::Status s = svc_->SubmitJob(nullptr, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("stages"), std::string::npos);
  EXPECT_NE(s.error_message().find("schedule"), std::string::npos);
}

}  // namespace
}  // namespace longhaul::coordinator
