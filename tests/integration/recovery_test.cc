// Failure recovery end to end (docs/recovery.md): real coordinator and worker processes on
// loopback; workers killed (SIGKILL), frozen (SIGSTOP), hung in a step while still sending
// heartbeats (the workers' test hook), their data directories deleted as if the machine had
// vanished; the coordinator killed and restarted on its state file (ctest label: integration).
// The cluster's heartbeat is every 300 ms with a 3 s timeout (tools/cluster).
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/list_dir.h"
#include "common/replica_counts.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

constexpr int kInterval = 5;  // checkpoint.interval of the jobs below
constexpr double kHeartbeatInterval = 0.3, kHeartbeatTimeout = 3.0;

// A small 3-stage job that takes a few seconds on 2 cores; `extra` adds YAML lines.
std::string Spec(int steps, const std::string& extra = "") {
  return absl::StrCat(R"(name: recover
model: {layers: 3, hidden: 64, heads: 4, context: 32}
stages: 3
micro_batches: 4
micro_batch_size: 4
codecs: {forward: "int8", backward: "int8"}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, clip_norm: 1.0}
steps: )", steps, "\nseed: 11\ncheckpoint: {interval: ", kInterval, "}\n", extra);
}

class RecoveryTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  absl::StatusOr<v1::JobStatus> WaitFor(uint64_t job, const std::function<bool(const v1::JobStatus&)>& done,
                                        absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    for (;;) {
      absl::StatusOr<v1::JobStatus> st = c_.Get(job);
      if (!st.ok() || done(*st) || absl::Now() > end) return st;
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  std::pair<int, std::string> Ctl(const std::string& args) {
    return Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " ", args));
  }
  // Runs `yaml` to the end and returns its final status (with losses).
  v1::JobStatus RunToEnd(const std::string& yaml) {
    absl::StatusOr<uint64_t> job = c_.Submit(yaml);
    EXPECT_TRUE(job.ok()) << job.status();
    absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(job.ok() ? *job : 0, absl::Minutes(4));
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::JobStatus();
  }
  // The recovered job's losses continue the reference run's: the re-run steps replay the same data
  // from the restored state.
  static void ExpectSameCurve(const v1::JobStatus& got, const v1::JobStatus& ref) {
    ASSERT_EQ(got.losses_size(), ref.losses_size());
    for (int i = 0; i < got.losses_size(); ++i) {
      EXPECT_NEAR(got.losses(i), ref.losses(i), 0.02 * std::abs(ref.losses(i))) << "step " << i + 1;
    }
    EXPECT_LT(std::abs(got.loss() - ref.loss()), 0.02 * std::abs(ref.loss()))
        << "final loss " << got.loss() << " vs " << ref.loss() << " without the failure";
  }
  // counts: the replicas of each stage (replicas: N, or a per-stage list where they differ).
  double KillAReplicaAndRecover(const std::string& dp_codec, const std::vector<int>& counts = {2, 2});
  Cluster c_;
};

TEST_F(RecoveryTest, KilledWorkerIsReplacedBySpareFromItsCheckpointCopy) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());  // 3 stages and a spare
  const v1::JobStatus ref = RunToEnd(Spec(30));
  ASSERT_EQ(ref.state(), v1::JOB_STATE_SUCCEEDED) << ref.error();
  ASSERT_TRUE(c_.WaitForIdleWorkers(4, absl::Seconds(30)).ok());

  absl::StatusOr<uint64_t> job = c_.Submit(Spec(30));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 13, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 1);
  ASSERT_TRUE(victim.ok());
  const absl::Time killed = absl::Now();
  c_.worker(*victim)->Signal(SIGKILL);
  // As if the machine had vanished: its checkpoints are gone too.
  ASSERT_TRUE(common::RemoveTree(absl::StrCat(c_.dir(), "/", *victim)).ok());

  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_EQ(st->restarts(), 1);
  ASSERT_EQ(st->recoveries_size(), 1);
  const v1::Recovery& r = st->recoveries(0);
  EXPECT_EQ(r.dead_worker(), *victim);
  EXPECT_NE(r.cause().find(absl::StrCat("worker ", *victim)), std::string::npos) << r.cause();
  // Detected within two heartbeat intervals plus the timeout (a killed process: at once).
  EXPECT_LT(r.detection_seconds(), 2 * kHeartbeatInterval + kHeartbeatTimeout);
  EXPECT_LT(r.failed_unix() - absl::ToDoubleSeconds(killed - absl::UnixEpoch()), 2 * kHeartbeatInterval + kHeartbeatTimeout);
  // At most one checkpoint interval re-run, from a checkpoint step.
  EXPECT_EQ(r.restored_step() % kInterval, 0);
  EXPECT_GT(r.restored_step(), 0);
  EXPECT_LE(r.failed_step() - r.restored_step(), kInterval) << "failed at " << r.failed_step();
  EXPECT_GT(r.recovery_seconds(), 0);
  // The spare took the stage, restored from the copy on another worker.
  EXPECT_NE(st->stages(1).worker_name(), *victim);
  ASSERT_EQ(r.replacements_size(), 1);
  EXPECT_NE(r.replacements(0).find(absl::StrCat(*victim, " -> ", st->stages(1).worker_name(), ", restored from the copy on")),
            std::string::npos)
      << r.replacements(0);
  ExpectSameCurve(*st, ref);
  // The CLI shows the restart.
  auto [rc, out] = Ctl(absl::StrCat("status ", *job));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("restarts: 1"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("restarted from step ", r.restored_step())), std::string::npos) << out;
}

// Replica 1 of stage 0 killed and its disk gone; the spare takes that slot from the copy on its
// pipeline neighbour (stage 1's replica 1 mod N_1; with one stage, replica 0's worker), the replica
// group re-forms for the new attempt, and the losses continue the undisturbed run's. Returns the
// largest relative difference of a step's loss from the undisturbed run's.
double RecoveryTest::KillAReplicaAndRecover(const std::string& dp_codec, const std::vector<int>& counts) {
  const int stages = static_cast<int>(counts.size());
  std::string replicas = absl::StrCat(counts[0]);
  if (std::count(counts.begin(), counts.end(), counts[0]) != stages) {
    replicas = absl::StrCat("[", absl::StrJoin(counts, ", "), "]");
  }
  int workers = 0;
  for (const int n : counts) workers += n;
  const std::string spec = absl::StrCat(R"(name: recover-replicas
model: {layers: 2, hidden: 64, heads: 4, context: 32}
stages: )", stages, R"(
replicas: )", replicas, R"(
data_parallel: {codec: )", dp_codec, R"(, timeout: 60s}
micro_batches: 4
micro_batch_size: 4
codecs: {forward: "int8", backward: "int8"}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, clip_norm: 1.0}
steps: 24
seed: 11
checkpoint: {interval: )", kInterval, "}\n");
  const v1::JobStatus ref = RunToEnd(spec);
  EXPECT_EQ(ref.state(), v1::JOB_STATE_SUCCEEDED) << ref.error();
  if (ref.state() != v1::JOB_STATE_SUCCEEDED || !c_.WaitForIdleWorkers(workers + 1, absl::Seconds(30)).ok()) {
    return 1;
  }

  absl::StatusOr<uint64_t> job = c_.Submit(spec);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok() || !c_.WaitForStep(*job, 13, absl::Minutes(2)).ok()) return 1;
  const int slot = SlotOf(counts, 0, 1);  // replica 1 of stage 0 (common/replica_counts.h)
  // Where its checkpoints were copied: its pipeline neighbour, or with one stage the other replica.
  const int holder = stages > 1 ? SlotOf(counts, 1, 1 % counts[1]) : SlotOf(counts, 0, 0);
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, slot);
  if (!victim.ok()) return 1;
  c_.worker(*victim)->Signal(SIGKILL);
  EXPECT_TRUE(common::RemoveTree(absl::StrCat(c_.dir(), "/", *victim)).ok());

  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return 1;
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_EQ(st->restarts(), 1);
  EXPECT_EQ(st->recoveries_size(), 1);
  if (st->recoveries_size() != 1) return 1;
  const v1::Recovery& r = st->recoveries(0);
  EXPECT_EQ(r.dead_worker(), *victim);
  EXPECT_GT(r.restored_step(), 0);
  EXPECT_LE(r.failed_step() - r.restored_step(), kInterval) << "failed at " << r.failed_step();
  EXPECT_EQ(r.replacements_size(), 1);
  if (r.replacements_size() != 1) return 1;
  EXPECT_NE(r.replacements(0).find(absl::StrCat("stage 0 replica 1: ", *victim, " -> ", st->stages(slot).worker_name(),
                                                ", restored from the copy on ", st->stages(holder).worker_name())),
            std::string::npos)
      << r.replacements(0);
  ExpectSameCurve(*st, ref);
  double worst = 0;
  for (int i = 0; i < std::min(st->losses_size(), ref.losses_size()); ++i) {
    worst = std::max(worst, std::abs(st->losses(i) - ref.losses(i)) / std::abs(ref.losses(i)));
  }
  std::printf("%s: failed at step %lld, restored step %lld: %s; final loss %.6f (undisturbed %.6f), largest "
              "relative difference of a step's loss %.2e\n",
              dp_codec.c_str(), static_cast<long long>(r.failed_step()), static_cast<long long>(r.restored_step()),
              r.replacements(0).c_str(), st->loss(), ref.loss(), worst);
  return worst;
}

// fp32 sync: every replica keeps the whole optimizer state, so each replica's checkpoint is
// complete.
TEST_F(RecoveryTest, KilledReplicaIsReplacedBySpareAndTheGroupReforms) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(5).ok());  // 4 slots and a spare
  KillAReplicaAndRecover("fp32");
}

// Replica counts that differ between stages (replicas: [2, 1]): stage 0's two replicas both stream
// to stage 1's one worker, which holds both of their checkpoint copies; replica 1 of stage 0 comes
// back on the spare from its copy there.
TEST_F(RecoveryTest, KilledReplicaOfAStageWithMoreReplicasThanItsNeighbourIsRecovered) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());  // 3 slots and a spare
  KillAReplicaAndRecover("fp32", /*counts=*/{2, 1});
}

// One stage: the replicas copy their checkpoints to each other (no pipeline neighbour), so a lost
// replica is restored from the copy on the other one, not from step 0.
TEST_F(RecoveryTest, OneStageReplicaIsRestoredFromTheOtherReplicasCopy) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());  // 2 replicas and a spare
  KillAReplicaAndRecover("fp32", /*counts=*/{2});
}

// sdp4bit: each replica keeps a shard of the optimizer state (moments and main weights), saved in
// its own checkpoints; the replacement restores the dead replica's shard from the copy, so the run
// continues as if undisturbed: the same losses to the last bit (a restart of the moments, or
// another replica's shard, would change them).
TEST_F(RecoveryTest, KilledShardedReplicaRestoresItsOptimizerShard) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(5).ok());
  EXPECT_EQ(KillAReplicaAndRecover("sdp4bit"), 0.0);
}

// One stage with sdp4bit: the replicas' checkpoints differ (each holds its own shard), and each
// worker holds the other replica's copy next to its own, named by replica: the lost replica's
// shard comes back from the copy, and the losses are the undisturbed run's to the last bit.
TEST_F(RecoveryTest, OneStageShardedReplicaRestoresItsShardFromTheOtherReplicasCopy) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  EXPECT_EQ(KillAReplicaAndRecover("sdp4bit", /*counts=*/{2}), 0.0);
}

TEST_F(RecoveryTest, StoppedWorkerIsRecoveredLikeADeadOne) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(25));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 8, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 2);
  ASSERT_TRUE(victim.ok());
  c_.worker(*victim)->Signal(SIGSTOP);  // alive to the kernel, silent to everyone
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  c_.worker(*victim)->Signal(SIGKILL);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  ASSERT_EQ(st->restarts(), 1);
  const v1::Recovery& r = st->recoveries(0);
  EXPECT_NE(r.cause().find("no heartbeat"), std::string::npos) << r.cause();
  // The heartbeat timeout, plus up to an interval and the monitor's 200 ms tick.
  EXPECT_LT(r.detection_seconds(), 2 * kHeartbeatInterval + kHeartbeatTimeout);
  EXPECT_LE(r.failed_step() - r.restored_step(), kInterval);
  EXPECT_EQ(st->losses_size(), 25);
}

// A stage that stops making progress while its process keeps sending heartbeats: the progress
// watchdog finds it (it computes while its neighbours wait for it), its worker is treated as lost
// and a spare takes the stage from the last checkpoint. The hung process reconnects, still
// running the stage, and is given no work.
TEST_F(RecoveryTest, HungStageThatStillHeartBeatsIsRecoveredOntoASpare) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  // The test hook (worker/main.cc): stage 1 of a job's first attempt hangs before step 9, on
  // whichever worker runs it; a later attempt does not.
  setenv("LONGHAUL_TEST_HANG_AT_STEP", "9", 1);
  setenv("LONGHAUL_TEST_HANG_STAGE", "1", 1);
  const absl::Status started = c_.StartWorkers(4);
  unsetenv("LONGHAUL_TEST_HANG_AT_STEP");
  unsetenv("LONGHAUL_TEST_HANG_STAGE");
  ASSERT_TRUE(started.ok()) << started;
  constexpr double kMinTimeout = 2;
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(25, "recovery: {progress_timeout_min: 2s}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 8, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 1);
  ASSERT_TRUE(victim.ok());
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  ASSERT_EQ(st->restarts(), 1);
  const v1::Recovery& r = st->recoveries(0);
  EXPECT_TRUE(r.no_progress());
  EXPECT_EQ(r.dead_worker(), *victim);
  EXPECT_NE(r.cause().find("no progress for"), std::string::npos) << r.cause();
  EXPECT_NE(r.cause().find("stage 1: computing step 9"), std::string::npos) << r.cause();
  // Found after the timeout — max(2 s, 10 x the step time) — plus at most a heartbeat interval
  // and the monitor's tick; not after the neighbours' 10-minute receive timeout.
  EXPECT_GT(r.detection_seconds(), kMinTimeout);
  EXPECT_LT(r.detection_seconds(), std::max(kMinTimeout, 10 * st->expected_step_seconds()) + 3);
  EXPECT_EQ(r.failed_step(), 8);
  EXPECT_EQ(r.restored_step(), kInterval);
  EXPECT_NE(st->stages(1).worker_name(), *victim);
  EXPECT_EQ(st->losses_size(), 25);
  std::printf("hung stage: detected %.2f s after the last step (expected step %.3f s), training again %.2f s after\n",
              r.detection_seconds(), st->expected_step_seconds(), r.recovery_seconds());
  auto [rc, out] = Ctl(absl::StrCat("status ", *job));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("after the last step (progress watchdog)"), std::string::npos) << out;
  // The hung worker came back, still running its stage: busy, not given work.
  bool drained = false;
  for (int i = 0; i < 100 && !drained; ++i) {
    absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
    ASSERT_TRUE(ws.ok()) << ws.status();
    for (const v1::WorkerStatus& w : *ws) {
      drained |= w.info().name() == *victim && w.state() == v1::WORKER_STATE_BUSY &&
                 w.note().find("still running stage 1") != std::string::npos;
    }
    if (!drained) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(drained) << *victim << " should be busy with its hung stage";
  c_.worker(*victim)->Signal(SIGKILL);
}

TEST_F(RecoveryTest, KilledCoordinatorRestartsOnItsStateFileAndTheJobCompletes) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(300));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 10, absl::Minutes(2)).ok());
  ASSERT_TRUE(c_.KillCoordinator().ok());
  absl::SleepFor(absl::Seconds(1));  // the workers notice and keep training
  ASSERT_TRUE(c_.StartCoordinator().ok());
  absl::StatusOr<v1::JobStatus> running = c_.Get(*job);
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->state(), v1::JOB_STATE_RUNNING) << "the job should still be running: make it longer";
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  // The workers came back and were re-attached: no restart was needed, and the progress they made
  // while the coordinator was away reached it.
  EXPECT_EQ(st->restarts(), 0);
  EXPECT_EQ(st->step(), 300);
  EXPECT_EQ(st->losses_size(), 300);
  ASSERT_TRUE(c_.WaitForIdleWorkers(3, absl::Seconds(30)).ok());
}

TEST_F(RecoveryTest, WithoutASpareTheJobWaitsInRecoveringUntilAWorkerRegisters) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(30));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 8, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 0);
  ASSERT_TRUE(victim.ok());
  c_.worker(*victim)->Signal(SIGKILL);
  absl::StatusOr<v1::JobStatus> st = WaitFor(
      *job, [](const v1::JobStatus& s) { return s.pending_reason().find("spare") != std::string::npos; },
      absl::Seconds(30));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_RECOVERING);
  EXPECT_NE(st->pending_reason().find(absl::StrCat("waiting for 1 spare worker to replace ", *victim)), std::string::npos)
      << st->pending_reason();
  auto [rc, table] = Ctl("status");
  EXPECT_EQ(rc, 0) << table;
  EXPECT_NE(table.find("RECOVERING"), std::string::npos) << table;
  EXPECT_NE(table.find("spare worker"), std::string::npos) << table;

  ASSERT_TRUE(c_.StartWorkers(1).ok());  // a replacement machine arrives
  st = c_.WaitForEnd(*job, absl::Minutes(4));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_EQ(st->restarts(), 1);
  EXPECT_EQ(st->stages(0).worker_name(), "w3");
}

TEST_F(RecoveryTest, WithoutASpareAndNoWaitTheJobFailsNamingTheWorker) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(1000, "recovery: {wait: 0}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 3, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 1);
  ASSERT_TRUE(victim.ok());
  c_.worker(*victim)->Signal(SIGKILL);
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(1));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st->error().find(absl::StrCat("worker ", *victim)), std::string::npos) << st->error();
  EXPECT_NE(st->error().find("no spare worker came within recovery.wait"), std::string::npos) << st->error();
  // The survivors are free again.
  ASSERT_TRUE(c_.WaitForIdleWorkers(2, absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace longhaul::cluster
