// End-to-end: real coordinator and worker processes on loopback, real gRPC, real SQLite file,
// real LibTorch training (ctest label: integration).
#include <signal.h>

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "coordinator/job_spec.h"
#include "stage_runtime/compute_threads.h"
#include "stage_runtime/pipeline.h"
#include "tools/cluster/local_cluster.h"
#include "worker/stage_runner.h"

namespace longhaul::cluster {
namespace {

// A small model so that CI on 2 cores runs each job in seconds.
std::string Spec(const std::string& fwd, const std::string& bwd, int steps, double rate_mbit = 0, int stages = 4,
                 int streams = 1) {
  return absl::StrCat(R"(name: it
model: {layers: 4, hidden: 64, heads: 4, context: 32}
stages: )", stages, R"(
schedule: 1f1b
micro_batches: 4
micro_batch_size: 4
codecs: {forward: ")", fwd, R"(", backward: ")", bwd, R"("}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, clip_norm: 1.0}
steps: )", steps, R"(
seed: 7
links: {rate_mbit: )", rate_mbit, ", streams: ", streams, "}\n");
}

class ClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  Cluster c_;
};

// Over links striped across 2 streams each (links.streams): the frames' order and bytes survive the
// striping exactly, or the losses would differ.
TEST_F(ClusterTest, Fp32JobMatchesInProcessPipeline) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  const std::string yaml = Spec("fp32", "fp32", 8, 0, 4, /*streams=*/2);
  absl::StatusOr<uint64_t> job = c_.Submit(yaml);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(3));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  ASSERT_EQ(st->losses_size(), 8);
  EXPECT_EQ(st->wire_bytes() > 0, true);

  // The same job through the in-process driver: same spec, same seed, same data.
  absl::StatusOr<v1::JobSpec> spec = coordinator::ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<stage_runtime::PipelineOptions> o = worker::ToPipelineOptions(*spec);
  ASSERT_TRUE(o.ok());
  stage_runtime::SetComputeThreads(1);  // as the workers run
  auto pipe = stage_runtime::InProcessPipeline::Create(*o);
  ASSERT_TRUE(pipe.ok());
  auto data = stage_runtime::TextDataset::DefaultCorpus();
  ASSERT_TRUE(data.ok());
  for (int step = 0; step < 8; ++step) {
    std::vector<stage_runtime::Batch> mbs;
    for (int m = 0; m < o->micro_batches; ++m) {
      mbs.push_back(data->Sample(stage_runtime::Split::kTrain, o->seed, step, m, o->micro_batch_size, o->model.context));
    }
    auto r = (*pipe)->TrainStep(mbs);
    ASSERT_TRUE(r.ok()) << r.status();
    const double got = st->losses(step);
    EXPECT_LT(std::abs(got - r->loss) / std::abs(r->loss), 1e-5) << "step " << step << ": job " << got
                                                                  << " vs in-process " << r->loss;
  }
}

TEST_F(ClusterTest, TahQuantJobTrainsOverShapedLinks) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec("tahquant", "int8", 30, /*rate_mbit=*/100));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(4));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  ASSERT_EQ(st->losses_size(), 30);
  double tail = 0;
  for (int i = 25; i < 30; ++i) tail += st->losses(i) / 5;
  EXPECT_LT(tail, st->losses(0) - 1.0) << "initial " << st->losses(0) << ", mean of last 5 " << tail;
  // Compressed links: TAH-Quant forward + INT8 backward together are > 4x smaller than fp32.
  EXPECT_GT(static_cast<double>(st->raw_bytes()) / st->wire_bytes(), 4.0);
  EXPECT_GT(st->mean_rel_error(), 0.0);
  for (const auto& p : st->stages()) EXPECT_FALSE(p.checkpoint_path().empty());
}

TEST_F(ClusterTest, InvalidSpecIsRejectedWithEveryReason) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  std::string bad = Spec("tahquant:g=7", "int8", 0, -5);
  bad = absl::StrReplaceAll(bad, {{"heads: 4", "heads: 5"}, {"schedule: 1f1b", "schedule: zigzag\nlearning: fast"}});
  absl::StatusOr<uint64_t> job = c_.Submit(bad);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(job.status().message());
  for (const char* want : {"model.hidden", "schedule", "learning", "codecs.forward", "steps", "links.rate_mbit"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << msg;
  }
  // Through the CLI: non-zero exit, one line per problem.
  const std::string path = absl::StrCat(c_.dir(), "/bad.yaml");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(bad.c_str(), f);
  std::fclose(f);
  auto [rc, out] = Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " submit ", path));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("was rejected"), std::string::npos) << out;
  EXPECT_NE(out.find("  - schedule"), std::string::npos) << out;
  // Nothing was recorded.
  auto [rc2, jobs] = Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " status"));
  EXPECT_EQ(rc2, 0) << jobs;
  EXPECT_EQ(jobs.find("it "), std::string::npos) << jobs;
}

// Without a spare and with recovery.wait 0 (docs/recovery.md; recovery_test.cc has the rest).
TEST_F(ClusterTest, KilledWorkerFailsJobNamingItAndLeavesOthersHealthy) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec("tahquant", "int8", 100000) + "recovery: {wait: 0}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(c_.WaitForStep(*job, 3, absl::Minutes(2)).ok());
  absl::StatusOr<std::string> victim = c_.WorkerOf(*job, 2);
  ASSERT_TRUE(victim.ok());
  c_.worker(*victim)->Signal(SIGKILL);

  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st->error().find(absl::StrCat("worker ", *victim)), std::string::npos) << st->error();

  // The coordinator still answers, the victim is dead, the other three become idle again ...
  ASSERT_TRUE(c_.WaitForIdleWorkers(3, absl::Seconds(30)).ok());
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  for (const auto& w : *ws) {
    EXPECT_EQ(w.state(), w.info().name() == *victim ? v1::WORKER_STATE_DEAD : v1::WORKER_STATE_IDLE)
        << w.info().name() << ": " << w.note();
  }
  // ... and can run a new job.
  absl::StatusOr<uint64_t> job2 = c_.Submit(Spec("int4", "int8", 3, 0, /*stages=*/3));
  ASSERT_TRUE(job2.ok()) << job2.status();
  absl::StatusOr<v1::JobStatus> st2 = c_.WaitForEnd(*job2, absl::Minutes(2));
  ASSERT_TRUE(st2.ok()) << st2.status();
  EXPECT_EQ(st2->state(), v1::JOB_STATE_SUCCEEDED) << st2->error();
}

TEST_F(ClusterTest, StatusSurvivesCoordinatorRestartAndWorkersExitCleanly) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec("int8", "int8", 4, 0, /*stages=*/2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> before = c_.WaitForEnd(*job, absl::Minutes(2));
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->state(), v1::JOB_STATE_SUCCEEDED) << before->error();

  ASSERT_TRUE(c_.RestartCoordinator().ok());
  absl::StatusOr<v1::JobStatus> after = c_.Get(*job, true);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(after->step(), 4);
  ASSERT_EQ(after->losses_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(after->losses(i), before->losses(i));
  auto [rc, out] = Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " status ", *job));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;

  // The workers notice the restart, register again and are usable.
  ASSERT_TRUE(c_.WaitForIdleWorkers(2, absl::Seconds(30)).ok());
  // SIGTERM: a clean exit, and the coordinator marks the worker dead.
  c_.worker("w0")->Signal(SIGTERM);
  EXPECT_EQ(c_.worker("w0")->Wait(absl::Seconds(10)), 0);
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  for (const auto& w : *ws) {
    if (w.info().name() == "w0") {
      EXPECT_EQ(w.state(), v1::WORKER_STATE_DEAD);
    }
  }
}

}  // namespace
}  // namespace longhaul::cluster
