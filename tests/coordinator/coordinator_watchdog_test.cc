// The progress watchdog and the straggler flag (coordinator_watchdog.cc, docs/recovery.md) with a
// fake clock: fake workers report steps and, in their heartbeats, what their stage is doing.
#include <map>
#include <memory>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_cost.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

using Fake = FakeStage;
using WatchdogTest = ServiceFixture;
constexpr auto kCompute = v1::StageActivity::PHASE_COMPUTE;
constexpr auto kReceive = v1::StageActivity::PHASE_RECEIVE;
constexpr auto kSetup = v1::StageActivity::PHASE_SETUP;
constexpr auto kSync = v1::StageActivity::PHASE_SYNC;

v1::StepProgress Timed(double step_seconds, double recv_wait = 0, double checkpoint_seconds = 0, bool checkpointed = false) {
  v1::StepProgress p;
  p.set_step_seconds(step_seconds);
  p.set_recv_wait_seconds(recv_wait);
  p.set_checkpoint_seconds(checkpoint_seconds);
  p.set_checkpointed(checkpointed);
  return p;
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(WatchdogTest, AHungStageIsTheOneItsNeighboursWaitForAndItsWorkerIsReplaced) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  Fake& c = Add("c");
  const uint64_t job = Submit(3, "recovery: {progress_timeout_factor: 10, progress_timeout_min: 5s}\ncheckpoint: {interval: 5}\n");
  Fake& spare = Add("spare");
  Fake* ws[] = {&a, &b, &c};
  for (int s = 0; s < 3; ++s) ws[s]->Doing(job, 0, kCompute, 0);
  for (int step = 1; step <= 6; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    for (int s = 0; s < 3; ++s) ws[s]->Report(job, s, step, 0, Timed(0.1, 0, 0, step == 5));
  }
  for (int s = 0; s < 3; ++s) ws[s]->Replicated(job, s, 5, 0, ws[(s + 1) % 3]->id());
  svc_->CheckHeartbeats();
  v1::JobStatus st = Job(job);
  EXPECT_DOUBLE_EQ(st.expected_step_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(st.progress_timeout_seconds(), 5);  // max(5 s, 10 x 0.1 s)

  // Stage 1 hangs in step 7 and keeps sending heartbeats; its neighbours wait for it.
  b.Doing(job, 0, kCompute, 6, -1, 1.0);
  a.Doing(job, 0, kReceive, 6, 1, 1.0);
  c.Doing(job, 0, kReceive, 6, 1, 1.0);
  Advance(absl::Milliseconds(4900));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(200));
  svc_->CheckHeartbeats();
  workers_.erase("b");  // its session was closed by the coordinator
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(st.recoveries_size(), 1);
  const v1::Recovery& r = st.recoveries(0);
  EXPECT_TRUE(r.no_progress());
  EXPECT_EQ(r.dead_worker(), "b");
  EXPECT_NEAR(r.detection_seconds(), 5.1, 1e-6);
  for (const char* want : {"no progress for 5.1 s (expected step 0.1 s, timeout 5.0 s); stage 1 hung",
                           "stage 0: waiting for stage 1 for 1.0 s", "stage 1: computing step 7 for 1.0 s"}) {
    EXPECT_TRUE(Contains(r.cause(), want)) << "missing \"" << want << "\" in " << r.cause();
  }
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_DEAD);
  EXPECT_TRUE(Contains(Worker("b").note(), "no progress for 5.1 s"));

  // Like a dead worker's: the others stop, the spare takes stage 1 from the copy of step 5.
  EXPECT_TRUE(a.Cancelled(job, 0));
  EXPECT_TRUE(c.Cancelled(job, 0));
  a.Finished(job, 0, 0, false);
  c.Finished(job, 2, 0, false);
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.stages(1).worker_name(), "spare");
  EXPECT_EQ(st.recoveries(0).restored_step(), 5);
  ASSERT_TRUE(spare.Assigned(job, 1).has_value());

  // b reconnects (its process is alive), still naming the hung stage: it takes no work.
  v1::RunningStage hung;
  hung.set_job_id(job);
  hung.set_stage(1);
  hung.set_attempt(0);
  Fake& b2 = Add("b", &hung);
  EXPECT_EQ(StateOf("b"), v1::WORKER_STATE_BUSY);
  b2.Heartbeat(job, 0);
  EXPECT_TRUE(b2.Cancelled(job, 0));
  EXPECT_EQ(Job(Submit(1)).state(), v1::JOB_STATE_PENDING);
}

// Replicated stages: the watchdog keeps its books by slot (replica r's stage s), as JobStatus.stages
// does: the step time is measured from the last stage of every replica, and a hung replica is the
// one named and replaced.
TEST_F(WatchdogTest, ReplicasAreWatchedSlotBySlot) {
  std::map<std::string, Fake*> by_name;
  for (const char* n : {"a", "b", "c", "d"}) by_name[n] = &Add(n);
  const uint64_t job = Submit(2, "replicas: 2\nmicro_batches: 4\n"
                                 "recovery: {progress_timeout_factor: 10, progress_timeout_min: 5s}\n");
  Add("spare");
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.stages_size(), 4);
  Fake* slot[4];
  for (int i = 0; i < 4; ++i) slot[i] = by_name.at(st.stages(i).worker_name());
  for (Fake* w : slot) w->Doing(job, 0, kCompute, 0);
  for (int step = 1; step <= 6; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    for (int i = 0; i < 4; ++i) {
      v1::StepProgress p = Timed(0.1);
      p.set_replica(i / 2);
      slot[i]->Report(job, i % 2, step, 0, p);
    }
  }
  svc_->CheckHeartbeats();
  st = Job(job);
  EXPECT_DOUBLE_EQ(st.expected_step_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(st.progress_timeout_seconds(), 5);

  // Replica 1's stage 0 hangs in step 7; its pipeline neighbour waits for it, and replica 0's
  // stages wait in their data-parallel syncs for their partners of replica 1.
  slot[2]->Doing(job, 0, kCompute, 6, -1, 1.0);
  slot[3]->Doing(job, 0, kReceive, 6, 0, 1.0);
  slot[0]->Doing(job, 0, kSync, 6, -1, 1.0);
  slot[1]->Doing(job, 0, kSync, 6, -1, 1.0);
  Advance(absl::Milliseconds(4900));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(200));
  svc_->CheckHeartbeats();
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(st.recoveries_size(), 1);
  const v1::Recovery& r = st.recoveries(0);
  EXPECT_EQ(r.dead_worker(), st.stages(2).worker_name());  // only it: the others wait
  EXPECT_EQ(StateOf(st.stages(0).worker_name()), v1::WORKER_STATE_BUSY);
  for (const char* want : {"stage 0 replica 1 hung", "stage 0 replica 1: computing step 7 for 1.0 s",
                           "stage 1 replica 1: waiting for stage 0 for 1.0 s",
                           "stage 0 replica 0: synchronising step 7 with its replicas for 1.0 s"}) {
    EXPECT_TRUE(Contains(r.cause(), want)) << "missing \"" << want << "\" in " << r.cause();
  }
}

TEST_F(WatchdogTest, TheTimeoutFollowsTheMeasuredStepWithRoomForStartUpFirstStepsAndCheckpoints) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  const uint64_t job = Submit(
      2, "recovery: {progress_timeout_factor: 10, progress_timeout_min: 5s, startup_timeout: 2m}\ncheckpoint: {interval: 5}\n");
  ASSERT_EQ(Job(job).predicted_step_seconds(), 0);  // links unmeasured: no prediction
  auto timeout = [&] {
    svc_->CheckHeartbeats();
    return Job(job).progress_timeout_seconds();
  };
  auto step = [&](int64_t n, int attempt, v1::StepProgress p) {
    a.Report(job, 0, n, attempt, p);
    b.Report(job, 1, n, attempt, p);
  };
  EXPECT_EQ(timeout(), 120);  // setting up
  a.Doing(job, 0, kCompute, 0);
  b.Doing(job, 0, kCompute, 0);
  EXPECT_EQ(timeout(), 120);  // stepping, but the step time is not known: the start-up allowance
  step(1, 0, Timed(1.0));
  EXPECT_EQ(timeout(), 120);  // a stage's first step (its warm-up) is not a sample
  EXPECT_EQ(Job(job).expected_step_seconds(), 0);
  step(2, 0, Timed(1.0));
  EXPECT_EQ(timeout(), 10);  // 10 x 1 s
  EXPECT_EQ(Job(job).expected_step_seconds(), 1);
  step(3, 0, Timed(1.0));
  step(4, 0, Timed(1.0));
  EXPECT_EQ(timeout(), 15);  // step 5 writes a checkpoint: + max(5 s, 10 x the 0 s seen so far)
  step(5, 0, Timed(1.0, 0, 2.0, true));
  EXPECT_EQ(timeout(), 10);
  for (int n = 6; n <= 9; ++n) step(n, 0, Timed(1.0));
  EXPECT_EQ(timeout(), 30);  // + 10 x the 2 s checkpoint

  // A restart's first step gets twice the time (warm-up, the pipeline's fill); the step time is kept.
  a.Finished(job, 0, 0, false, true, "stage 0: link to stage 1 broke");
  b.Finished(job, 1, 0, false);
  ASSERT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Job(job).attempt(), 1);
  EXPECT_EQ(timeout(), 120);  // setting up again
  a.Doing(job, 1, kCompute, 5);
  b.Doing(job, 1, kCompute, 5);
  EXPECT_EQ(timeout(), 20);
  step(6, 1, Timed(1.0));
  EXPECT_EQ(timeout(), 10);
}

TEST_F(WatchdogTest, AStageStillSettingUpAfterTheStartUpTimeoutIsHung) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  Add("spare");
  const uint64_t job = Submit(2, "recovery: {startup_timeout: 30s}\n");
  a.Doing(job, 0, kReceive, 0, 1, 5);
  b.Doing(job, 0, kSetup, 0, -1, 5);
  Advance(absl::Seconds(30));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(1));
  svc_->CheckHeartbeats();
  workers_.erase("b");
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(st.recoveries(0).dead_worker(), "b");
  EXPECT_TRUE(st.recoveries(0).no_progress());
  EXPECT_TRUE(Contains(st.recoveries(0).cause(),
                       "no progress for 31.0 s: not every stage started stepping within recovery.startup_timeout (30s)"))
      << st.recoveries(0).cause();
  EXPECT_TRUE(Contains(st.recoveries(0).cause(), "stage 1: setting up")) << st.recoveries(0).cause();
}

TEST_F(WatchdogTest, WhenEveryStageWaitsOnALinkTheyAllRestartOnTheirWorkers) {
  Fake& a = Add("a");
  Fake& b = Add("b");
  const uint64_t job = Submit(2, "recovery: {progress_timeout_min: 5s}\n");
  for (int step = 1; step <= 3; ++step) {
    a.Report(job, 0, step, 0, Timed(0.1));
    b.Report(job, 1, step, 0, Timed(0.1));
  }
  // A connection that stalls without breaking: each waits for the other.
  a.Doing(job, 0, kReceive, 3, 1);
  b.Doing(job, 1, kReceive, 3, 0);
  Advance(absl::Seconds(6));
  v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(st.recoveries(0).dead_worker(), "");
  EXPECT_TRUE(st.recoveries(0).no_progress());
  EXPECT_TRUE(Contains(st.recoveries(0).cause(), "every stage waits on a link")) << st.recoveries(0).cause();
  EXPECT_TRUE(a.Cancelled(job, 0));
  EXPECT_TRUE(b.Cancelled(job, 0));
  a.Finished(job, 0, 0, false);
  b.Finished(job, 1, 0, false);
  st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.stages(0).worker_name(), "a");
  EXPECT_EQ(st.stages(1).worker_name(), "b");
}

TEST_F(WatchdogTest, FactorZeroTurnsTheWatchdogOff) {
  Fake& a = Add("a");
  const uint64_t job = Submit(1, "recovery: {progress_timeout_factor: 0}\n");
  a.Report(job, 0, 1, 0, Timed(0.1));
  a.Report(job, 0, 2, 0, Timed(0.1));
  a.Doing(job, 0, kCompute, 2);
  Advance(absl::Hours(2));
  EXPECT_EQ(Job(job).state(), v1::JOB_STATE_RUNNING);
}

// The value of `name` with these labels in `registry`, or -1.
double Value(prometheus::Registry& registry, const std::string& name, const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& l : m.label) matched += labels.count(l.name) && labels.at(l.name) == l.value;
      if (matched == labels.size()) return m.gauge.value;
    }
  }
  return -1;
}

TEST_F(WatchdogTest, AStageComputingFarSlowerThanPredictedIsAStragglerInStatusAndMetrics) {
  // Workers that measured their speed: each stage is compared with the cost model's compute.
  Fake& a = Add("a", nullptr, 100);
  Fake& b = Add("b", nullptr, 100);
  const uint64_t job = Submit(2, "recovery: {straggler_factor: 3}\n");
  absl::StatusOr<placement::JobShape> shape = JobShapeOf(Job(job).spec());
  ASSERT_TRUE(shape.ok()) << shape.status();
  double predicted[2];
  for (int s = 0; s < 2; ++s) predicted[s] = shape->micro_batches * shape->stage_flops[s] / (100e9 * kComputeEfficiency);
  // Stage 1 computes 5x its prediction; stage 0 as predicted, waiting for stage 1 the rest of the step.
  const double step = 5 * predicted[1];
  for (int i = 1; i <= 6; ++i) {
    a.Report(job, 0, i, 0, Timed(step, step - predicted[0]));
    b.Report(job, 1, i, 0, Timed(step));
  }
  v1::JobStatus st = Job(job);
  EXPECT_EQ(st.stages(0).straggler(), "");
  EXPECT_NEAR(st.stages(0).compute_seconds(), predicted[0], 1e-9);
  EXPECT_NEAR(st.stages(1).compute_seconds(), step, 1e-9);
  EXPECT_NEAR(st.stages(1).predicted_compute_seconds(), predicted[1], 1e-12);
  EXPECT_TRUE(Contains(st.stages(1).straggler(), "5.0x its prediction")) << st.stages(1).straggler();
  EXPECT_TRUE(Contains(st.stages(1).straggler(), "b at 100.0 GFLOP/s; recovery.straggler_factor 3"))
      << st.stages(1).straggler();
  auto registry = std::make_shared<prometheus::Registry>();
  CoordinatorMetrics metrics(*registry, svc_.get());
  metrics.Refresh();
  const std::string id = absl::StrCat(job);
  EXPECT_EQ(Value(*registry, "longhaul_job_stage_straggler", {{"job_id", id}, {"stage", "1"}}), 1);
  EXPECT_EQ(Value(*registry, "longhaul_job_stage_straggler", {{"job_id", id}, {"stage", "0"}}), 0);
  EXPECT_NEAR(Value(*registry, "longhaul_job_stage_compute_seconds", {{"job_id", id}, {"stage", "1"}}), step, 1e-9);
  // Just under the factor it stays flagged (no flapping at the threshold); caught up, it is not.
  const double near = 2.6 * predicted[1];
  for (int i = 7; i <= 22; ++i) {
    a.Report(job, 0, i, 0, Timed(near, near - predicted[0]));
    b.Report(job, 1, i, 0, Timed(near));
  }
  EXPECT_TRUE(Contains(Job(job).stages(1).straggler(), "2.6x its prediction")) << Job(job).stages(1).straggler();
  for (int i = 23; i <= 38; ++i) {
    a.Report(job, 0, i, 0, Timed(predicted[1], predicted[1] - predicted[0]));
    b.Report(job, 1, i, 0, Timed(predicted[1]));
  }
  EXPECT_EQ(Job(job).stages(1).straggler(), "");
  metrics.Refresh();
  EXPECT_EQ(Value(*registry, "longhaul_job_stage_straggler", {{"job_id", id}, {"stage", "1"}}), 0);

  // Workers that measured nothing: a stage is compared with the other stages' speed per FLOP.
  Fake& c = Add("c");
  Fake& d = Add("d");
  const uint64_t other = Submit(2, "recovery: {straggler_factor: 3}\n");
  const double per_flop = 1e-9;
  for (int i = 1; i <= 6; ++i) {
    c.Report(other, 0, i, 0, Timed(4 * per_flop * shape->stage_flops[1], 4 * per_flop * shape->stage_flops[1] -
                                                                               per_flop * shape->stage_flops[0]));
    d.Report(other, 1, i, 0, Timed(4 * per_flop * shape->stage_flops[1]));
  }
  st = Job(other);
  EXPECT_EQ(st.stages(0).straggler(), "");
  EXPECT_TRUE(Contains(st.stages(1).straggler(), "4.0x its prediction")) << st.stages(1).straggler();
  EXPECT_TRUE(Contains(st.stages(1).straggler(), "from the other stages' speed")) << st.stages(1).straggler();
}

}  // namespace
}  // namespace longhaul::coordinator
