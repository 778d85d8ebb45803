// The coordinator's recovery state machine (coordinator_recovery.cc, docs/recovery.md) with a fake
// clock: fake workers hold real Session streams to the service on an in-process gRPC server and
// report steps, checkpoints, copies and ends as a stage would; deaths are closed sessions or
// silence past the heartbeat timeout.
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <vector>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_spec.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

using Fake = FakeStage;
using RecoveryTest = ServiceFixture;

// One stage, replicas: each replica's checkpoints are copied to the next replica's worker (the last
// replica's to replica 0's), whether the replicas' checkpoints are alike (fp32) or each holds its
// own optimizer shard (sdp4bit, zeropp: the copy store names copies by replica).
TEST_F(RecoveryTest, OneStageReplicasCopyTheirCheckpointsToTheNextReplicaWhateverTheSync) {
  for (const char* codec : {"fp32", "sdp4bit", "zeropp"}) {
    SCOPED_TRACE(codec);
    std::vector<Fake*> ws;
    for (int i = 0; i < 3; ++i) ws.push_back(&Add(absl::StrCat(codec, "-", i)));
    const uint64_t job =
        Submit(1, absl::StrCat("replicas: 3\nmicro_batches: 3\ndata_parallel: {codec: ", codec, "}\n"));
    const v1::JobStatus st = Job(job);
    ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(st.stages_size(), 3);
    std::map<uint64_t, Fake*> by_id;
    for (Fake* w : ws) by_id[w->id()] = w;
    for (int r = 0; r < 3; ++r) {
      std::optional<v1::StageAssignment> a = by_id.at(st.stages(r).worker_id())->Assigned(job, 0);
      ASSERT_TRUE(a.has_value());
      EXPECT_EQ(a->replica_index(), r);
      EXPECT_EQ(a->replica().worker_id(), st.stages((r + 1) % 3).worker_id()) << "replica " << r;
    }
  }
}

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

// A worker cut off and declared dead that comes back still running its old stage (a partition, a
// SIGCONT): its stage has a spare now. It takes no work until that stage has ended.
TEST_F(RecoveryTest, AWorkerBackWithAStageThatMovedTakesNoWorkUntilThatStageEnds) {
  Fake& a = Add("a");
  Add("b");
  Add("spare");
  const uint64_t job = Submit(2);
  ASSERT_EQ(Job(job).stages(1).worker_name(), "b");
  Kill("b");
  a.Finished(job, 0, 0, false);
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Job(job).stages(1).worker_name(), "spare");
  v1::RunningStage r;
  r.set_job_id(job);
  r.set_stage(1);
  r.set_attempt(0);
  Fake& b = Add("b", &r);
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  EXPECT_NE(Worker("b").note().find(absl::StrCat("still running stage 1 of job ", job, " (attempt 0): stage 1 of job ",
                                                 job, " has moved to another worker")),
            std::string::npos)
      << Worker("b").note();
  // A job submitted now waits rather than going to b (it would be refused as busy and restart).
  const uint64_t next = Submit(1);
  EXPECT_EQ(Job(next).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(next).pending_reason(), "waiting for 1 idle worker, 0 idle");
  // Its heartbeats get the old stage cancelled; a report of a step of it changes nothing.
  b.Heartbeat(job, 0);
  EXPECT_TRUE(b.Cancelled(job, 0));
  b.Progress(job, 1, 3, 0);
  EXPECT_EQ(Job(job).stages(1).step(), 0);
  Advance(absl::Seconds(40));
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  // The stage ends: b is free and takes the waiting job.
  b.Finished(job, 1, 0, false);
  ASSERT_EQ(Job(next).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(next).stages(0).worker_name(), "b");
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
}

// A failed job's stage that never reports its end: its worker gets a note after the stop timeout
// and no work while its heartbeats say it still runs the stage; a heartbeat with nothing running
// frees it (also at once, when only the end was lost).
TEST_F(RecoveryTest, AnEndedJobsStageThatDoesNotReportItsEndHoldsItsWorkerOnlyWhileItRuns) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  Add("c");
  const uint64_t job = Submit(2);
  a.Finished(job, 0, 0, false, false, "stage 0: data: cannot open /nope");
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(b.Cancelled(job, 0));
  EXPECT_EQ(StateOf("a"), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  // b's stage hangs: its heartbeats keep naming it, and are answered with the cancellation.
  Advance(absl::Seconds(29));
  b.Heartbeat(job, 0);
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(Worker("b").note(), "");
  Advance(absl::Seconds(2));
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  EXPECT_NE(Worker("b").note().find(absl::StrCat("its stage of job ", job, " did not stop within 30s of the job's end")),
            std::string::npos)
      << Worker("b").note();
  const uint64_t big = Submit(3);
  EXPECT_EQ(Job(big).pending_reason(), "waiting for 3 idle workers, 2 idle");
  b.Idle();  // the stage ended after all
  ASSERT_EQ(Job(big).state(), v1::JOB_STATE_RUNNING);

  // The end of a stage lost on its way: the first heartbeat with nothing running frees the worker.
  Fake& d = Add("d");
  Fake& e = Add("e");
  const uint64_t lost = Submit(2);
  ASSERT_EQ(Job(lost).stages(1).worker_name(), "e");
  d.Finished(lost, 0, 0, false, false, "stage 0: boom");
  ASSERT_EQ(Job(lost).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(StateOf("e"), v1::WORKER_STATE_BUSY);
  e.Idle();
  EXPECT_EQ(StateOf("e"), v1::WORKER_STATE_IDLE);
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
