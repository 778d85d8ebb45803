// The coordinator's state machine with a fake clock: the service methods called directly (no
// network) for heartbeat timeouts, admission, cancellation and what a restart does to persisted
// jobs; the job queue's rule (PlanQueue) on its own; and scheduling with fake workers that hold
// real Session streams to the service on an in-process gRPC server.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempStatePath("longhaul-coord");
    Open();
  }
  void TearDown() override {
    svc_.reset();
    RemoveStateFiles(path_);
  }
  void Open() {
    svc_.reset();
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(10);
    o.queue.reserve_after = absl::Minutes(1);
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
  uint64_t Submit(int stages, const std::string& name = "job", const std::string& extra = "") {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(absl::StrCat("name: ", name, "\nstages: ", stages, "\nmodel: {layers: 4}\nsteps: 5\n", extra));
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
    return resp.job_id();
  }
  void Cancel(uint64_t id) {
    v1::CancelJobRequest c;
    c.set_job_id(id);
    v1::CancelJobResponse cr;
    EXPECT_TRUE(svc_->CancelJob(nullptr, &c, &cr).ok());
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
  EXPECT_NE(w.note().find("no heartbeat for 11s (timeout 10s)"), std::string::npos) << w.note();
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

// Running jobs wait for their workers to come back (coordinator_recovery_test.cc has the rest).
TEST_F(CoordinatorTest, RestartKeepsJobsAndTheOnesThatWereRunningWaitForTheirWorkers) {
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
    running.mutable_spec()->set_stages(1);
    running.mutable_spec()->mutable_recovery()->set_max_restarts(1);
    running.mutable_spec()->mutable_recovery()->set_wait_seconds(0);
    v1::StagePlacement* p = running.add_stages();
    p->set_worker_id(1);
    p->set_worker_name("w0");
    ASSERT_TRUE((*store)->PutJob(running).ok());
  }
  Open();
  EXPECT_EQ(Job(pending.job_id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(pending.job_id()).name(), "kept");
  // Still queued, and it says why: every worker is dead until it registers again.
  EXPECT_EQ(Job(pending.job_id()).pending_reason(), "needs 4 workers, only 0 live (waiting for more workers to register)");
  EXPECT_EQ(Job(50).state(), v1::JOB_STATE_RUNNING);
  // w0 does not come back within the grace (30 s by default); without a spare (recovery.wait 0)
  // the job fails, naming it.
  clock_.Advance(absl::Seconds(31));
  svc_->CheckHeartbeats();
  const v1::JobStatus r = Job(50);
  EXPECT_EQ(r.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(r.error().find("worker(s) w0 did not come back within 30s of the coordinator's restart"), std::string::npos)
      << r.error();
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

// ---------------------------------------------------------------------------------------------
// The queue's rule on its own.

std::vector<uint64_t> Started(const QueuePlan& p) {
  std::vector<uint64_t> ids;
  for (const auto& s : p.start) ids.push_back(s.job_id);
  return ids;
}

TEST(PlanQueueTest, JobsThatDoNotFitAreSkippedAndLaterOnesStart) {
  const absl::Time t0 = absl::UnixEpoch();
  const QueuePlan p = PlanQueue({{1, 3, t0}, {2, 1, t0}, {3, 2, t0}, {4, 1, t0}}, {7, 8}, 2, t0, {});
  EXPECT_EQ(Started(p), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(p.start[0].workers, (std::vector<uint64_t>{7}));  // the preferred idle worker first
  EXPECT_EQ(p.start[1].workers, (std::vector<uint64_t>{8}));
  EXPECT_EQ(p.waiting.at(1), "needs 3 workers, only 2 live (waiting for more workers to register)");
  EXPECT_EQ(p.waiting.at(3), "waiting for 2 idle workers, 0 idle");
}

TEST(PlanQueueTest, AJobThatWaitedTooLongHoldsBackTheJobsBehindIt) {
  const absl::Time t0 = absl::UnixEpoch();
  QueueOptions o;
  o.reserve_after = absl::Minutes(10);
  // Job 1 needs both live workers; one is busy. Before the limit, job 2 takes the idle one ...
  QueuePlan p = PlanQueue({{1, 2, t0}, {2, 1, t0 + absl::Minutes(1)}}, {5}, 2, t0 + absl::Minutes(9), o);
  EXPECT_EQ(Started(p), (std::vector<uint64_t>{2}));
  EXPECT_EQ(p.waiting.at(1), "waiting for 2 idle workers, 0 idle");
  // ... after it, job 1 has the first claim and job 2 waits for it.
  p = PlanQueue({{1, 2, t0}, {2, 1, t0 + absl::Minutes(1)}}, {5}, 2, t0 + absl::Minutes(10), o);
  EXPECT_TRUE(p.start.empty());
  EXPECT_EQ(p.waiting.at(1), "waiting for 2 idle workers, 1 idle; waited longer than 10m, so jobs submitted after it "
                             "wait for it");
  EXPECT_EQ(p.waiting.at(2), "held behind job 1, which has waited longer than 10m and has the first claim on idle workers");
  // Jobs before the reservation are not affected, and it starts as soon as it fits.
  p = PlanQueue({{3, 1, t0}, {1, 2, t0}, {2, 1, t0}}, {4, 5, 6}, 3, t0 + absl::Hours(1), o);
  EXPECT_EQ(Started(p), (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(p.start[1].workers, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(p.waiting.at(2), "waiting for 1 idle worker, 0 idle; waited longer than 10m, so jobs submitted after it "
                             "wait for it");
}

TEST(PlanQueueTest, AJobTheClusterCannotRunNeverHoldsOthersBack) {
  const absl::Time t0 = absl::UnixEpoch();
  const QueuePlan p = PlanQueue({{1, 5, t0}, {2, 1, t0}}, {9}, 4, t0 + absl::Hours(24), {});
  EXPECT_EQ(Started(p), (std::vector<uint64_t>{2}));
  EXPECT_EQ(p.waiting.at(1), "needs 5 workers, only 4 live (waiting for more workers to register)");
}

// ---------------------------------------------------------------------------------------------
// Scheduling in the service, with fake workers on real Session streams.

// A worker as the coordinator sees it: registered, its Session open, keeping what it is sent.
class FakeWorker : public FakeSession {
 public:
  FakeWorker(v1::Coordinator::Stub& stub, const std::string& name) : FakeSession(stub, Registration(name)) {}

  // The job it was last assigned (0: none), once that is `want` or after a few seconds.
  uint64_t assigned(uint64_t want) {
    auto last = [](const std::vector<v1::CoordinatorMessage>& got) {
      for (auto it = got.rbegin(); it != got.rend(); ++it) {
        if (it->has_assign()) return it->assign().job_id();
      }
      return uint64_t{0};
    };
    WaitUntil([&](const std::vector<v1::CoordinatorMessage>& got) { return last(got) == want; }, absl::Seconds(10));
    return last(Received());
  }
  // Reports a completed step of its (single-stage) job, and waits until the coordinator has it.
  void Progress(uint64_t job, int64_t step, int64_t tokens, double checkpoint_seconds = 0) {
    v1::WorkerMessage m;
    v1::StepProgress* p = m.mutable_progress();
    p->set_job_id(job);
    p->set_step(step);
    p->set_tokens(tokens);
    p->set_step_seconds(1);
    p->set_checkpoint_seconds(checkpoint_seconds);
    Send(m);
  }
  // Reports its stage of `job` done at the planned step (the coordinator takes a stage that ends
  // before it as failed), and waits until the coordinator has taken that in.
  void Finish(uint64_t job) {
    v1::WorkerMessage m, at_end;
    m.mutable_finished()->set_job_id(job);
    m.mutable_finished()->set_ok(true);
    at_end.mutable_progress()->set_job_id(job);
    at_end.mutable_progress()->set_step_seconds(1);
    // The assignment names the stage, attempt and planned steps: wait for it to have arrived (the
    // coordinator may have sent it a moment ago).
    WaitUntil(
        [&](const std::vector<v1::CoordinatorMessage>& got) {
          for (const auto& c : got) {
            if (c.has_assign() && c.assign().job_id() == job) return true;
          }
          return false;
        },
        absl::Seconds(10));
    for (const auto& c : Received()) {
      if (!c.has_assign() || c.assign().job_id() != job) continue;
      m.mutable_finished()->set_stage(c.assign().stage());
      m.mutable_finished()->set_attempt(c.assign().attempt());
      at_end.mutable_progress()->set_stage(c.assign().stage());
      at_end.mutable_progress()->set_attempt(c.assign().attempt());
      at_end.mutable_progress()->set_step(c.assign().spec().steps());
    }
    Send(at_end);
    Send(m);
  }
};

class SchedulingTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    server_ = ServeOnLoopback(svc_.get(), &stub_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    workers_.clear();
    if (svc_) svc_->Stop();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    server_.reset();  // before the service it calls
    CoordinatorTest::TearDown();
  }
  FakeWorker& AddWorker(const std::string& name) {
    workers_.push_back(std::make_unique<FakeWorker>(*stub_, name));
    return *workers_.back();
  }
  // Time passes; the workers keep their heartbeats up.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    for (auto& w : workers_) w->Ping();
    svc_->CheckHeartbeats();
  }

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

// tokens/s is the steady state: from the first step's report on, checkpoint writes left out.
TEST_F(SchedulingTest, ThroughputLeavesOutStartUpAndCheckpointWrites) {
  FakeWorker& a = AddWorker("a");
  const uint64_t job = Submit(1, "timed");
  ASSERT_EQ(a.assigned(job), job);
  clock_.Advance(absl::Seconds(30));  // start-up: not counted
  a.Progress(job, 1, 1000);
  clock_.Advance(absl::Seconds(2));
  a.Progress(job, 2, 1000);
  EXPECT_DOUBLE_EQ(Job(job).tokens_per_s(), 500);
  // Step 3 took 2 s of training and wrote a 6 s checkpoint.
  clock_.Advance(absl::Seconds(8));
  a.Progress(job, 3, 1000, 6.0);
  EXPECT_DOUBLE_EQ(Job(job).tokens_per_s(), 500);
  clock_.Advance(absl::Seconds(1));
  a.Progress(job, 4, 1000);
  EXPECT_DOUBLE_EQ(Job(job).tokens_per_s(), 600);  // 3000 tokens in 5 s of training
}

TEST_F(SchedulingTest, ABigJobDoesNotHoldBackSmallerOnes) {
  FakeWorker& a = AddWorker("a");
  FakeWorker& b = AddWorker("b");
  const uint64_t big = Submit(3, "big");
  const uint64_t small = Submit(1, "small");
  const uint64_t pair = Submit(2, "pair");
  EXPECT_EQ(Job(big).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(big).pending_reason(), "needs 3 workers, only 2 live (waiting for more workers to register)");
  ASSERT_EQ(Job(small).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(small).stages(0).worker_id(), a.id());
  EXPECT_EQ(Job(pair).pending_reason(), "waiting for 2 idle workers, 1 idle");
  // The small job ends: the pair starts on both workers, the big one still waits.
  a.Finish(small);
  EXPECT_EQ(Job(small).state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(Job(pair).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(pair).pending_reason(), "");
  EXPECT_EQ(a.assigned(pair), pair);
  EXPECT_EQ(b.assigned(pair), pair);
  EXPECT_EQ(Job(big).state(), v1::JOB_STATE_PENDING);
  // A third worker registers and the pair ends: now the big one fits.
  FakeWorker& c = AddWorker("c");
  EXPECT_EQ(Job(big).pending_reason(), "waiting for 3 idle workers, 1 idle");
  a.Finish(pair);
  b.Finish(pair);
  ASSERT_EQ(Job(big).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c.assigned(big), big);
}

TEST_F(SchedulingTest, AJobWaitingTooLongIsServedBeforeLaterOnesAndCancellingItLetsThemStart) {
  FakeWorker& a = AddWorker("a");
  FakeWorker& b = AddWorker("b");
  const uint64_t running = Submit(1, "running");
  const uint64_t pair = Submit(2, "pair");
  EXPECT_EQ(Job(pair).pending_reason(), "waiting for 2 idle workers, 1 idle");
  // Past reserve_after (1 min here) the pair becomes a reservation: the single job waits for it,
  // though a worker is idle.
  Advance(absl::Seconds(61));
  const uint64_t single = Submit(1, "single");
  EXPECT_EQ(Job(single).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(single).pending_reason(), absl::StrCat("held behind job ", pair,
                                                       ", which has waited longer than 1m and has the first claim on "
                                                       "idle workers"));
  // Cancelling the pending pair takes it out of the queue and the single job starts at once.
  Cancel(pair);
  EXPECT_EQ(Job(pair).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Job(pair).pending_reason(), "");
  ASSERT_EQ(Job(single).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(b.assigned(single), single);
  EXPECT_EQ(a.assigned(running), running);
}

TEST_F(SchedulingTest, AReservationStartsWhenItsWorkersFree) {
  FakeWorker& a = AddWorker("a");
  FakeWorker& b = AddWorker("b");
  const uint64_t first = Submit(1, "first");
  const uint64_t pair = Submit(2, "pair");
  Advance(absl::Minutes(2));
  const uint64_t single = Submit(1, "single");
  EXPECT_EQ(Job(single).state(), v1::JOB_STATE_PENDING);
  a.Finish(first);
  ASSERT_EQ(Job(pair).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(b.assigned(pair), pair);
  EXPECT_EQ(Job(single).pending_reason(), "waiting for 1 idle worker, 0 idle");
}

// Without a spare and with recovery.wait 0 (coordinator_recovery_test.cc has the recoveries).
TEST_F(SchedulingTest, ADeadWorkersJobFailsNamingItAndTheSilence) {
  AddWorker("a");
  const uint64_t job = Submit(1, "job", "recovery: {wait: 0}\n");
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(11));
  svc_->CheckHeartbeats();
  const v1::JobStatus st = Job(job);
  EXPECT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st.error().find("worker a (id "), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("no heartbeat for 11s (timeout 10s)"), std::string::npos) << st.error();
}

TEST_F(SchedulingTest, AClosedSessionFailsTheJobSayingWhenTheWorkerWasLastHeardFrom) {
  AddWorker("a");
  const uint64_t job = Submit(1, "job", "recovery: {wait: 0}\n");
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1500));
  workers_.clear();  // cancels its stream
  v1::JobStatus st;
  for (int i = 0; i < 200 && !IsTerminal((st = Job(job)).state()); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st.error().find("worker a (id "), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("session closed"), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("last heartbeat 1.5s before"), std::string::npos) << st.error();
}

// Replicated stages (docs/replicated-stages.md): 2 stages x 2 replicas on 4 workers, replica r of
// stage s at slot r*2+s; a job needing more workers than are registered is refused with the numbers.
TEST_F(SchedulingTest, ReplicatedStagesGetAWorkerPerReplicaAndTheirGroups) {
  FakeWorker& a = AddWorker("a");
  FakeWorker& b = AddWorker("b");
  FakeWorker& c = AddWorker("c");
  const std::string spec = "name: rep\nstages: 2\nreplicas: 2\nmicro_batches: 4\nmodel: {layers: 4}\nsteps: 5\n"
                           "data_parallel: {codec: sdp4bit}\n";
  v1::SubmitJobRequest req;
  req.set_spec_yaml(spec);
  v1::SubmitJobResponse resp;
  grpc::Status refused = svc_->SubmitJob(nullptr, &req, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(), "needs 4 workers (2 stages x 2 replicas), 3 are idle, 3 registered");

  FakeWorker& d = AddWorker("d");
  ASSERT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
  const uint64_t job = resp.job_id();
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(st.stages_size(), 4);
  std::map<uint64_t, FakeWorker*> by_id = {{a.id(), &a}, {b.id(), &b}, {c.id(), &c}, {d.id(), &d}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(st.stages(i).stage(), i % 2);
    EXPECT_EQ(st.stages(i).replica(), i / 2);
    FakeWorker* w = by_id.at(st.stages(i).worker_id());
    ASSERT_EQ(w->assigned(job), job);
    v1::StageAssignment as;
    for (const auto& m : w->Received()) {
      if (m.has_assign()) as = m.assign();
    }
    EXPECT_EQ(as.stage(), i % 2);
    EXPECT_EQ(as.replica_index(), i / 2);
    ASSERT_EQ(as.replica_group_size(), 2);
    EXPECT_EQ(as.replica_group(0).worker_id(), st.stages(i % 2).worker_id());
    EXPECT_EQ(as.replica_group(1).worker_id(), st.stages(2 + i % 2).worker_id());
    // Replica r's stage 0 streams to replica r's stage 1.
    if (i % 2 == 0) {
      EXPECT_EQ(as.next().worker_id(), st.stages(i + 1).worker_id());
    } else {
      EXPECT_EQ(as.prev().worker_id(), st.stages(i - 1).worker_id());
    }
  }
  // The loss is replica 0's report of the last stage (the mean over replicas); every slot ends.
  for (int i = 3; i >= 0; --i) {
    FakeWorker* w = by_id.at(st.stages(i).worker_id());
    v1::WorkerMessage m;
    v1::StepProgress* p = m.mutable_progress();
    p->set_job_id(job);
    p->set_stage(i % 2);
    p->set_replica(i / 2);
    p->set_step(1);
    p->set_loss(i == 1 ? 2.5 : 9.0);
    p->set_dp_bytes(100);
    p->set_dp_raw_bytes(400);
    p->mutable_dp_sync()->set_busiest_link_bytes(10 * (i + 1));
    p->mutable_dp_sync()->set_seconds(0.5 + i);
    w->Send(m);
  }
  EXPECT_EQ(Job(job).step(), 1);
  EXPECT_DOUBLE_EQ(Job(job).loss(), 2.5);
  EXPECT_EQ(Job(job).dp_bytes_per_step(), 400);
  EXPECT_EQ(Job(job).dp_raw_bytes_per_step(), 1600);
  EXPECT_EQ(Job(job).dp_busiest_link_bytes(), 40);  // the largest of any replica's
  const v1::JobStatus after_step = Job(job);
  for (const v1::StagePlacement& sp : after_step.stages()) {  // and each replica's own, in its slot
    const int i = sp.replica() * 2 + sp.stage();
    EXPECT_EQ(sp.dp_sync().busiest_link_bytes(), 10 * (i + 1)) << "slot " << i;
    EXPECT_DOUBLE_EQ(sp.dp_sync().seconds(), 0.5 + i) << "slot " << i;
  }
  for (int i = 0; i < 4; ++i) {
    FakeWorker* w = by_id.at(st.stages(i).worker_id());
    v1::WorkerMessage at_end;  // the planned step reached (a stage that ends before it has failed)
    at_end.mutable_progress()->set_job_id(job);
    at_end.mutable_progress()->set_stage(i % 2);
    at_end.mutable_progress()->set_replica(i / 2);
    at_end.mutable_progress()->set_step(st.spec().steps());
    w->Send(at_end);
    v1::WorkerMessage m;
    m.mutable_finished()->set_job_id(job);
    m.mutable_finished()->set_stage(i % 2);
    m.mutable_finished()->set_replica(i / 2);
    m.mutable_finished()->set_ok(true);
    w->Send(m);
    EXPECT_EQ(Job(job).state(), i < 3 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_SUCCEEDED);
  }
}

// Replica counts that differ between stages (replicas: [1, 2]): slots replica-major (stage 0,
// stage 1 replica 0, stage 1 replica 1); stage 0's one worker exchanges micro-batches with both of
// stage 1's, each of those with it; stage 1's replicas form a group, stage 0 none; checkpoint copies
// go to replica r mod N of the next stage; the job ends when every slot has.
TEST_F(SchedulingTest, PerStageReplicaCountsGetFannedNeighboursAndGroups) {
  FakeWorker& a = AddWorker("a");
  FakeWorker& b = AddWorker("b");
  FakeWorker& c = AddWorker("c");
  const std::string spec = "name: fan\nstages: 2\nreplicas: [1, 2]\nmicro_batches: 4\nmodel: {layers: 4}\nsteps: 5\n";
  v1::SubmitJobRequest req;
  req.set_spec_yaml(spec);
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
  const uint64_t job = resp.job_id();
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(st.stages_size(), 3);
  const int want_stage[] = {0, 1, 1}, want_replica[] = {0, 0, 1};
  std::map<uint64_t, FakeWorker*> by_id = {{a.id(), &a}, {b.id(), &b}, {c.id(), &c}};
  std::vector<v1::StageAssignment> as(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(st.stages(i).stage(), want_stage[i]);
    EXPECT_EQ(st.stages(i).replica(), want_replica[i]);
    FakeWorker* w = by_id.at(st.stages(i).worker_id());
    ASSERT_EQ(w->assigned(job), job);
    for (const auto& m : w->Received()) {
      if (m.has_assign()) as[i] = m.assign();
    }
    EXPECT_EQ(as[i].stage(), want_stage[i]);
    EXPECT_EQ(as[i].replica_index(), want_replica[i]);
  }
  const uint64_t s0 = st.stages(0).worker_id(), s1r0 = st.stages(1).worker_id(), s1r1 = st.stages(2).worker_id();
  // Stage 0: both of stage 1's replicas listed, no group of its own; its copies to replica 0 of stage 1.
  ASSERT_EQ(as[0].next_replicas_size(), 2);
  EXPECT_EQ(as[0].next_replicas(0).worker_id(), s1r0);
  EXPECT_EQ(as[0].next_replicas(1).worker_id(), s1r1);
  EXPECT_EQ(as[0].next().worker_id(), s1r0);
  EXPECT_EQ(as[0].replica_group_size(), 0);
  EXPECT_EQ(as[0].replica().worker_id(), s1r0);
  // Stage 1's replicas: stage 0's worker before them, each other as the group; copies of both to stage 0.
  for (int i = 1; i < 3; ++i) {
    ASSERT_EQ(as[i].prev_replicas_size(), 1);
    EXPECT_EQ(as[i].prev_replicas(0).worker_id(), s0);
    EXPECT_EQ(as[i].prev().worker_id(), s0);
    ASSERT_EQ(as[i].replica_group_size(), 2);
    EXPECT_EQ(as[i].replica_group(0).worker_id(), s1r0);
    EXPECT_EQ(as[i].replica_group(1).worker_id(), s1r1);
    EXPECT_EQ(as[i].replica().worker_id(), s0);
  }
  for (int i = 0; i < 3; ++i) {
    FakeWorker* w = by_id.at(st.stages(i).worker_id());
    v1::WorkerMessage at_end;
    at_end.mutable_progress()->set_job_id(job);
    at_end.mutable_progress()->set_stage(want_stage[i]);
    at_end.mutable_progress()->set_replica(want_replica[i]);
    at_end.mutable_progress()->set_step(st.spec().steps());
    w->Send(at_end);
    v1::WorkerMessage m;
    m.mutable_finished()->set_job_id(job);
    m.mutable_finished()->set_stage(want_stage[i]);
    m.mutable_finished()->set_replica(want_replica[i]);
    m.mutable_finished()->set_ok(true);
    w->Send(m);
    EXPECT_EQ(Job(job).state(), i < 2 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_SUCCEEDED);
  }
}

}  // namespace
}  // namespace longhaul::coordinator
