// The coordinator's recovery state machine (coordinator_recovery.cc, docs/recovery.md) with a fake
// clock: fake workers hold real Session streams to the service on an in-process gRPC server and
// report steps, checkpoints, copies and ends as a stage would; deaths are closed sessions or
// silence past the heartbeat timeout.
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_spec.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

// A worker as the coordinator sees it, keeping every message it is sent.
class Fake : public FakeSession {
 public:
  // `running`: the stage it says it runs when it registers (after a coordinator restart).
  Fake(v1::Coordinator::Stub& stub, const std::string& name, const v1::RunningStage* running = nullptr)
      : FakeSession(stub, Request(name, running)) {}

  void Heartbeat(uint64_t job, int attempt) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_running_job_id(job);
    m.mutable_heartbeat()->set_running_attempt(attempt);
    Send(m);
  }
  void Progress(uint64_t job, int stage, int64_t step, int attempt, bool checkpointed = false) {
    v1::WorkerMessage m;
    v1::StepProgress* p = m.mutable_progress();
    p->set_job_id(job);
    p->set_stage(stage);
    p->set_step(step);
    p->set_attempt(attempt);
    p->set_checkpointed(checkpointed);
    p->set_loss(5.0 - 0.01 * static_cast<double>(step));
    Send(m);
  }
  void Replicated(uint64_t job, int stage, int64_t step, int attempt, uint64_t to) {
    v1::WorkerMessage m;
    v1::CheckpointReplicated* r = m.mutable_replicated();
    r->set_job_id(job);
    r->set_stage(stage);
    r->set_step(step);
    r->set_attempt(attempt);
    r->set_replica_worker_id(to);
    Send(m);
  }
  void Finished(uint64_t job, int stage, int attempt, bool ok, bool retryable = true, const std::string& error = "") {
    v1::WorkerMessage m;
    v1::JobFinished* f = m.mutable_finished();
    f->set_job_id(job);
    f->set_stage(stage);
    f->set_attempt(attempt);
    f->set_ok(ok);
    f->set_retryable(retryable);
    f->set_error(error);
    Send(m);
  }

  // The last assignment of `job` with at least `attempt`, waiting a few seconds for it.
  std::optional<v1::StageAssignment> Assigned(uint64_t job, int attempt) {
    std::optional<v1::StageAssignment> a;
    WaitFor([&](const v1::CoordinatorMessage& c) {
      if (c.has_assign() && c.assign().job_id() == job && c.assign().attempt() >= attempt) a = c.assign();
      return a.has_value();
    });
    return a;
  }
  bool Cancelled(uint64_t job, int attempt) {
    return WaitFor([&](const v1::CoordinatorMessage& c) {
      return c.has_cancel() && c.cancel().job_id() == job && c.cancel().attempt() == attempt;
    });
  }
  bool GotFloor(uint64_t job, int64_t step) {
    return WaitFor([&](const v1::CoordinatorMessage& c) {
      return c.has_checkpoint_floor() && c.checkpoint_floor().job_id() == job && c.checkpoint_floor().step() == step;
    });
  }

 private:
  static v1::RegisterRequest Request(const std::string& name, const v1::RunningStage* running) {
    v1::RegisterRequest req = Registration(name, absl::StrCat(name, ":1"));
    if (running != nullptr) *req.mutable_running() = *running;
    return req;
  }
};

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempStatePath("longhaul-recovery");
    Start();
  }
  void TearDown() override {
    StopService();
    RemoveStateFiles(path_);
  }
  void Start() {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(10);
    o.reattach_grace = absl::Seconds(20);
    o.stop_timeout = absl::Seconds(30);
    o.clock = &clock_;
    auto svc = CoordinatorService::Create(std::move(*store), o);
    ASSERT_TRUE(svc.ok()) << svc.status();
    svc_ = std::move(*svc);
    server_ = ServeOnLoopback(svc_.get(), &stub_);
    ASSERT_NE(server_, nullptr);
  }
  // As a coordinator going away: its sessions end first (the workers are not lost), then the fakes.
  void StopService() {
    if (svc_) svc_->Stop();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    workers_.clear();
    server_.reset();
    svc_.reset();
  }
  Fake& Add(const std::string& name, const v1::RunningStage* running = nullptr) {
    workers_[name] = std::make_unique<Fake>(*stub_, name, running);
    return *workers_[name];
  }
  void Kill(const std::string& name) {
    workers_.erase(name);  // its session closes
    // The service notices on its own thread: wait until it has.
    for (int i = 0; i < 500; ++i) {
      v1::ListWorkersResponse r;
      EXPECT_TRUE(svc_->ListWorkers(nullptr, nullptr, &r).ok());
      for (const auto& w : r.workers()) {
        if (w.info().name() == name && w.state() == v1::WORKER_STATE_DEAD) return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << name << " was not declared dead";
  }
  // Time passes; the live fakes keep their heartbeats up.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    for (auto& [name, w] : workers_) w->Ping();
    svc_->CheckHeartbeats();
  }
  uint64_t Submit(int stages, const std::string& extra = "") {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(absl::StrCat("name: r\nstages: ", stages, "\nmodel: {layers: 4}\nsteps: 100\n", extra));
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
    return resp.job_id();
  }
  v1::JobStatus Job(uint64_t id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::JobStatus st;
    EXPECT_TRUE(svc_->GetJob(nullptr, &req, &st).ok());
    return st;
  }
  v1::WorkerState StateOf(const std::string& name) {
    v1::ListWorkersResponse r;
    EXPECT_TRUE(svc_->ListWorkers(nullptr, nullptr, &r).ok());
    for (const auto& w : r.workers()) {
      if (w.info().name() == name) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  }

  common::FakeClock clock_{absl::UnixEpoch() + absl::Hours(1000)};
  std::string path_;
  std::unique_ptr<CoordinatorService> svc_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<std::string, std::unique_ptr<Fake>> workers_;
};

TEST_F(RecoveryTest, ADeadWorkersStageMovesToASpareAndEveryStageRestartsFromTheNewestCommonCheckpoint) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  Fake& c = Add("c");
  const uint64_t job = Submit(3);
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  Fake& spare = Add("spare");  // registered after the start: idle
  // Each stage's checkpoints are copied to the next stage's worker.
  ASSERT_TRUE(a.Assigned(job, 0).has_value());
  EXPECT_EQ(a.Assigned(job, 0)->replica().worker_id(), b.id());
  EXPECT_EQ(c.Assigned(job, 0)->replica().worker_id(), a.id());
  // Step 5: every stage checkpointed and copied. Step 10: stage 1's copy had not arrived.
  Fake* ws[] = {&a, &b, &c};
  for (int s = 0; s < 3; ++s) ws[s]->Progress(job, s, 5, 0, true);
  for (int s = 0; s < 3; ++s) ws[s]->Replicated(job, s, 5, 0, ws[(s + 1) % 3]->id());
  for (int s = 0; s < 3; ++s) ws[s]->Progress(job, s, 10, 0, true);
  a.Replicated(job, 0, 10, 0, b.id());
  c.Replicated(job, 2, 10, 0, a.id());
  c.Progress(job, 2, 12, 0);
  Advance(absl::Seconds(1));  // the floor goes out: step 5 is restorable everywhere
  EXPECT_TRUE(a.GotFloor(job, 5));

  Kill("b");
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(st.restarts(), 1);
  EXPECT_EQ(st.attempt(), 1);
  ASSERT_EQ(st.recoveries_size(), 1);
  EXPECT_EQ(st.recoveries(0).dead_worker(), "b");
  EXPECT_EQ(st.recoveries(0).failed_step(), 12);
  EXPECT_NE(st.recoveries(0).cause().find("session closed"), std::string::npos) << st.recoveries(0).cause();
  EXPECT_EQ(st.pending_reason(), "waiting for stages 0, 2 of the failed attempt to stop");
  // The survivors are told to stop their attempt, and do.
  EXPECT_TRUE(a.Cancelled(job, 0));
  EXPECT_TRUE(c.Cancelled(job, 0));
  a.Finished(job, 0, 0, false);
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(Job(job).pending_reason(), "waiting for stage 2 of the failed attempt to stop");
  c.Finished(job, 2, 0, false);

  // Step 10 is not restorable for stage 1 (its disk is gone, its copy never arrived): step 5.
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.step(), 5);
  EXPECT_EQ(st.stages(1).worker_name(), "spare");
  EXPECT_EQ(st.recoveries(0).restored_step(), 5);
  ASSERT_EQ(st.recoveries(0).replacements_size(), 1);
  EXPECT_EQ(st.recoveries(0).replacements(0), "stage 1: b -> spare, restored from the copy on c");
  std::optional<v1::StageAssignment> as = spare.Assigned(job, 1);
  ASSERT_TRUE(as.has_value());
  EXPECT_EQ(as->stage(), 1);
  EXPECT_EQ(as->restore_step(), 5);
  ASSERT_EQ(as->restore_from_size(), 1);
  EXPECT_EQ(as->restore_from(0).name(), "c");
  EXPECT_EQ(as->prev().worker_id(), a.id());
  EXPECT_EQ(as->next().worker_id(), c.id());
  std::optional<v1::StageAssignment> aa = a.Assigned(job, 1);
  ASSERT_TRUE(aa.has_value());
  EXPECT_EQ(aa->restore_step(), 5);
  EXPECT_EQ(aa->next().worker_id(), spare.id());
  EXPECT_EQ(aa->replica().worker_id(), spare.id());
  EXPECT_EQ(StateOf("spare"), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_BUSY);

  // Reports of the failed attempt no longer count; the new attempt's first step ends the recovery.
  c.Progress(job, 2, 13, 0);
  EXPECT_EQ(Job(job).step(), 5);
  clock_.Advance(absl::Seconds(4));
  c.Progress(job, 2, 6, 1);
  st = Job(job);
  EXPECT_EQ(st.step(), 6);
  EXPECT_DOUBLE_EQ(st.recoveries(0).recovery_seconds(), 4);
  // The job ends normally; its workers are freed together.
  a.Finished(job, 0, 1, true);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_BUSY);
  spare.Finished(job, 1, 1, true);
  c.Finished(job, 2, 1, true);
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_SUCCEEDED);
  for (const char* n : {"a", "c", "spare"}) EXPECT_EQ(StateOf(n), v1::WORKER_STATE_IDLE) << n;
}

TEST_F(RecoveryTest, WithoutASpareTheJobWaitsThenTakesAWorkerThatRegisters) {
  Fake& a = Add("a");
  Add("b");
  const uint64_t job = Submit(2, "recovery: {wait: 5m}\n");
  Kill("b");
  a.Finished(job, 0, 0, false);
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(st.pending_reason(),
            "waiting for 1 spare worker to replace b (stage 1); 0 idle; fails in 300.0s (recovery.wait) unless "
            "workers register");
  Advance(absl::Minutes(4));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RECOVERING);
  Fake& d = Add("d");
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  std::optional<v1::StageAssignment> as = d.Assigned(job, 1);
  ASSERT_TRUE(as.has_value());
  EXPECT_EQ(as->restore_step(), 0);  // nothing was checkpointed: from the start
  // From the start, every stage says so.
  ASSERT_EQ(Job(job).recoveries(0).replacements_size(), 2);
  EXPECT_EQ(Job(job).recoveries(0).replacements(1), "stage 1: b -> d, from the start (no checkpoint every stage has)");
}

TEST_F(RecoveryTest, WithoutASpareInTimeTheJobFailsNamingTheDeadWorker) {
  Fake& a = Add("a");
  Add("b");
  const uint64_t job = Submit(2, "recovery: {wait: 60}\n");
  Kill("b");
  a.Finished(job, 0, 0, false);
  Advance(absl::Seconds(59));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RECOVERING);
  Advance(absl::Seconds(2));
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st.error().find("worker b (id "), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("no spare worker came within recovery.wait (1m): needed 1 spare worker to replace b"),
            std::string::npos)
      << st.error();
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_IDLE);
}

TEST_F(RecoveryTest, RestartsAreBoundedAndAStagesOwnErrorFailsAtOnce) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  const uint64_t job = Submit(2, "recovery: {max_restarts: 1}\n");
  // A neighbour's link broke (retryable): restart on the same workers.
  a.Finished(job, 0, 0, false, true, "stage 0: link from stage 1 broke");
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(b.Cancelled(job, 0));
  b.Finished(job, 1, 0, false);
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(a.Assigned(job, 1).has_value());
  EXPECT_EQ(Job(job).recoveries(0).replacements(0), "stage 0: a, from the start (no checkpoint every stage has)");
  // Again: out of restarts.
  b.Finished(job, 1, 1, false, true, "stage 1: link from stage 0 broke");
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st.error().find("gave up after 1 restart(s) (recovery.max_restarts)"), std::string::npos) << st.error();
  EXPECT_TRUE(a.Cancelled(job, 1));
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_BUSY);  // until its stage reports its end
  a.Finished(job, 0, 1, false);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_IDLE);

  // A stage's own error (bad data, ...) is not retried.
  const uint64_t job2 = Submit(2);
  a.Finished(job2, 0, 0, false, false, "stage 0: data: cannot open /nope");
  st = Job(job2);
  EXPECT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(st.restarts(), 0);
  EXPECT_NE(st.error().find("cannot open /nope"), std::string::npos) << st.error();
}

TEST_F(RecoveryTest, AStageThatDoesNotStopIsTreatedAsLost) {
  Add("a");
  Add("b");
  const uint64_t job = Submit(2);
  Kill("b");
  EXPECT_EQ(Job(job).pending_reason(), "waiting for stage 0 of the failed attempt to stop");
  // a heart-beats but never reports its end (a hung stage): lost after stop_timeout (30 s here).
  Advance(absl::Seconds(29));
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_BUSY);
  clock_.Advance(absl::Seconds(2));
  workers_["a"]->Ping();
  svc_->CheckHeartbeats();
  workers_.erase("a");  // its session was closed by the coordinator
  v1::JobStatus st = Job(job);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_DEAD);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_NE(st.recoveries(0).cause().find("did not stop within 30s"), std::string::npos) << st.recoveries(0).cause();
  EXPECT_NE(st.pending_reason().find("waiting for 2 spare workers to replace a, b (stages 0, 1)"), std::string::npos)
      << st.pending_reason();
  Add("c");
  Add("d");
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(RecoveryTest, AStaleHeartbeatIsCancelledWithItsAttempt) {
  Fake& a = Add("a");
  const uint64_t job = Submit(1);
  a.Heartbeat(job, 0);  // as expected: nothing
  a.Finished(job, 0, 0, false, true, "stage 0: boom");
  a.Heartbeat(job, 0);  // the failed attempt still running on it: told to stop that attempt
  EXPECT_TRUE(a.Cancelled(job, 0));
  std::optional<v1::StageAssignment> as = a.Assigned(job, 1);
  ASSERT_TRUE(as.has_value());
  EXPECT_EQ(as->attempt(), 1);
}

TEST_F(RecoveryTest, AfterACoordinatorRestartWorkersReattachAndAbsentOnesAreRecovered) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  const uint64_t job = Submit(2);
  a.Progress(job, 0, 5, 0, true);
  b.Progress(job, 1, 5, 0, true);
  a.Replicated(job, 0, 5, 0, b.id());
  b.Replicated(job, 1, 5, 0, a.id());
  StopService();  // the workers' sessions go with it
  Start();
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  // a comes back naming its stage; b does not.
  v1::RunningStage r;
  r.set_job_id(job);
  r.set_stage(0);
  r.set_attempt(0);
  Fake& a2 = Add("a", &r);
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_BUSY);
  a2.Progress(job, 0, 7, 0);
  EXPECT_EQ(Job(job).stages(0).step(), 7);
  Advance(absl::Seconds(19));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  Advance(absl::Seconds(2));
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_NE(st.recoveries(0).cause().find("worker(s) b did not come back within 20s"), std::string::npos)
      << st.recoveries(0).cause();
  EXPECT_TRUE(a2.Cancelled(job, 0));
  a2.Finished(job, 0, 0, false);
  Fake& d = Add("d");
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.recoveries(0).restored_step(), 5);  // b's copy is on a
  std::optional<v1::StageAssignment> as = d.Assigned(job, 1);
  ASSERT_TRUE(as.has_value());
  ASSERT_EQ(as->restore_from_size(), 1);
  EXPECT_EQ(as->restore_from(0).name(), "a");
}

TEST(RecoverySpecTest, DefaultsParsingAndProblems) {
  absl::StatusOr<v1::JobSpec> d = ParseJobSpec("name: x\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->checkpoint_interval(), 50);
  EXPECT_EQ(d->checkpoint_replicate(), "peer");
  EXPECT_EQ(d->recovery().max_restarts(), 10);
  EXPECT_EQ(d->recovery().wait_seconds(), 600);
  absl::StatusOr<v1::JobSpec> s =
      ParseJobSpec("recovery: {max_restarts: 3, wait: 90s}\ncheckpoint: {interval: 0, replicate: none}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->recovery().max_restarts(), 3);
  EXPECT_EQ(s->recovery().wait_seconds(), 90);
  EXPECT_EQ(s->checkpoint_interval(), 0);
  EXPECT_EQ(s->checkpoint_replicate(), "none");
  absl::StatusOr<v1::JobSpec> bad =
      ParseJobSpec("recovery: {max_restarts: -1, wait: soon}\ncheckpoint: {replicate: coordinator}\n");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  for (const char* want : {"recovery.max_restarts: -1 is out of range", "recovery.wait: \"soon\" is not a duration",
                           "checkpoint.replicate: \"coordinator\" is not peer or none (coordinator is not implemented yet)"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << msg;
  }
}

}  // namespace
}  // namespace longhaul::coordinator
