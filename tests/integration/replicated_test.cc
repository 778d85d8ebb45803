// Replicated stages end to end (docs/replicated-stages.md): real coordinator and worker processes
// on loopback, the replicas of each stage synchronising over the workers' Collective gRPC service
// (ctest label: integration).
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stage_runtime/checkpoint.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

// A small model, 2 stages; pipeline links in fp32 so that only the data-parallel codec differs.
// `replicas`: a count, or a per-stage list ("[2, 1]"). `clip_norm`: small enough, the global
// clipping acts at every step, so a stage whose gradients were scaled wrongly (replica counts that
// differ between stages) would change every stage's update, which AdamW alone would not show.
std::string Spec(const std::string& replicas, const std::string& dp_codec, int steps, const char* clip_norm = "1.0") {
  return absl::StrCat(R"(name: rep
model: {layers: 4, hidden: 64, heads: 4, context: 32}
stages: 2
schedule: 1f1b
micro_batches: 4
micro_batch_size: 4
codecs: {forward: fp32, backward: fp32}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, clip_norm: )", clip_norm, R"(}
seed: 7
steps: )", steps, "\nreplicas: ", replicas, "\ndata_parallel: {codec: ", dp_codec, ", timeout: 60s}\n");
}

// FNV-1a over a stage checkpoint's model: every parameter's name and bytes in name order (0 when it
// cannot be read). The optimizer state ("__optim__." tensors) is left out: with sdp4bit each
// replica keeps its own shard of it; `shard_tensors` counts the shard's tensors.
uint64_t ModelChecksum(const std::string& path, int64_t* model_bytes, int* shard_tensors) {
  absl::StatusOr<stage_runtime::TensorFile> f = stage_runtime::ReadSafetensors(path);
  if (!f.ok()) return 0;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(p[i]);
      h *= 1099511628211ull;
    }
  };
  *model_bytes = 0;
  *shard_tensors = 0;
  for (const auto& [name, t] : f->tensors) {  // std::map: name order
    if (absl::StartsWith(name, "__optim__.")) {
      if (absl::StartsWith(name, "__optim__.dp.")) ++*shard_tensors;
      continue;
    }
    const torch::Tensor c = t.contiguous();
    mix(name.data(), name.size());
    mix(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
    *model_bytes += static_cast<int64_t>(c.nbytes());
  }
  return h;
}

class ReplicatedTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  absl::StatusOr<v1::JobStatus> Run(const std::string& yaml) {
    absl::StatusOr<uint64_t> job = c_.Submit(yaml);
    if (!job.ok()) return job.status();
    return c_.WaitForEnd(*job, absl::Minutes(4));
  }
  Cluster c_;
};

// fp32: the same global batch split over 2 replicas gives the losses of 1 replica.
TEST_F(ReplicatedTest, Fp32TwoReplicasMatchOneReplica) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  constexpr int kSteps = 8;
  constexpr const char* kClip = "0.05";
  absl::StatusOr<v1::JobStatus> one = Run(Spec("1", "fp32", kSteps, kClip));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->state(), v1::JOB_STATE_SUCCEEDED) << one->error();
  ASSERT_TRUE(c_.WaitForIdleWorkers(4, absl::Seconds(30)).ok());
  absl::StatusOr<v1::JobStatus> two = Run(Spec("2", "fp32", kSteps, kClip));
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->state(), v1::JOB_STATE_SUCCEEDED) << two->error();
  ASSERT_EQ(one->losses_size(), kSteps);
  ASSERT_EQ(two->losses_size(), kSteps);
  ASSERT_EQ(two->stages_size(), 4);
  double worst = 0;
  for (int i = 0; i < kSteps; ++i) {
    const double rel = std::abs(two->losses(i) - one->losses(i)) / std::abs(one->losses(i));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "step " << i << ": 2 replicas " << two->losses(i) << " vs 1 replica " << one->losses(i);
    std::printf("step %d: 1 replica %.7f, 2 replicas %.7f (rel %.2e)\n", i + 1, one->losses(i), two->losses(i), rel);
  }
  std::printf("fp32: largest relative difference %.2e; dp bytes per step %lld (fp32 contents %lld)\n", worst,
              static_cast<long long>(two->dp_bytes_per_step()), static_cast<long long>(two->dp_raw_bytes_per_step()));
  EXPECT_GT(two->dp_bytes_per_step(), 0);

  // Replica counts per stage (proto/replica_layout.h): 2 replicas of stage 0 both streaming to the
  // one of stage 1, and the reverse. Same global batch, so the same losses.
  for (const char* counts : {"[2, 1]", "[1, 2]"}) {
    SCOPED_TRACE(counts);
    ASSERT_TRUE(c_.WaitForIdleWorkers(4, absl::Seconds(30)).ok());
    absl::StatusOr<v1::JobStatus> mixed = Run(Spec(counts, "fp32", kSteps, kClip));
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    ASSERT_EQ(mixed->state(), v1::JOB_STATE_SUCCEEDED) << mixed->error();
    ASSERT_EQ(mixed->losses_size(), kSteps);
    ASSERT_EQ(mixed->stages_size(), 3);
    worst = 0;
    for (int i = 0; i < kSteps; ++i) {
      const double rel = std::abs(mixed->losses(i) - one->losses(i)) / std::abs(one->losses(i));
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-5) << "step " << i << ": replicas " << counts << " " << mixed->losses(i) << " vs 1 replica "
                           << one->losses(i);
    }
    std::printf("fp32, replicas %s: largest relative difference %.2e; dp bytes per step %lld\n", counts, worst,
                static_cast<long long>(mixed->dp_bytes_per_step()));
    EXPECT_GT(mixed->dp_bytes_per_step(), 0);
  }
}

// sdp4bit and bitdp2: the replicas of each stage end with bit-identical parameters (checksums of
// their final checkpoints' models) and the loss falls.
TEST_F(ReplicatedTest, CompressedSyncKeepsReplicasIdenticalAndTrains) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  constexpr int kSteps = 30;
  for (const char* codec : {"sdp4bit", "bitdp2"}) {
    SCOPED_TRACE(codec);
    ASSERT_TRUE(c_.WaitForIdleWorkers(4, absl::Seconds(30)).ok());
    absl::StatusOr<v1::JobStatus> st = Run(Spec("2", codec, kSteps));
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
    ASSERT_EQ(st->losses_size(), kSteps);
    double tail = 0;
    for (int i = kSteps - 5; i < kSteps; ++i) tail += st->losses(i) / 5;
    EXPECT_LT(tail, st->losses(0) - 1.0) << "initial " << st->losses(0) << ", mean of last 5 " << tail;
    std::printf("%s: loss %.4f -> %.4f (mean of last 5 %.4f); dp bytes per step %lld (fp32 contents %lld)\n", codec,
                st->losses(0), st->losses(kSteps - 1), tail, static_cast<long long>(st->dp_bytes_per_step()),
                static_cast<long long>(st->dp_raw_bytes_per_step()));
    EXPECT_LT(st->dp_bytes_per_step(), st->dp_raw_bytes_per_step());
    ASSERT_EQ(st->stages_size(), 4);
    for (const v1::StagePlacement& sp : st->stages()) {  // each replica's sync in parts, its update inside
      const v1::DpSyncFigures& d = sp.dp_sync();
      EXPECT_TRUE(d.has_update()) << codec;
      EXPECT_GT(d.before_update_seconds(), 0) << codec;
      EXPECT_LE(d.before_update_seconds() + d.update_seconds(), d.seconds()) << codec;
      EXPECT_LE(d.seconds(), d.step_seconds()) << codec;
    }
    for (int s = 0; s < 2; ++s) {
      const std::string pa = st->stages(s).checkpoint_path(), pb = st->stages(2 + s).checkpoint_path();
      int64_t bytes_a = 0, bytes_b = 0;
      int shard_a = 0, shard_b = 0;
      const uint64_t ha = ModelChecksum(pa, &bytes_a, &shard_a), hb = ModelChecksum(pb, &bytes_b, &shard_b);
      ASSERT_NE(ha, 0u) << pa;
      ASSERT_NE(pa, pb);
      EXPECT_EQ(ha, hb) << "stage " << s << ": the replicas' parameters differ (" << pa << " vs " << pb << ")";
      EXPECT_EQ(bytes_a, bytes_b);
      // sdp4bit's checkpoints hold each replica's optimizer shard (main weights and moments).
      EXPECT_EQ(shard_a, std::string(codec) == "sdp4bit" ? 3 : 0) << pa;
      EXPECT_EQ(shard_b, shard_a) << pb;
      std::printf("%s stage %d: parameters of replica 0 %016llx, replica 1 %016llx (%lld bytes)\n", codec, s,
                  static_cast<unsigned long long>(ha), static_cast<unsigned long long>(hb),
                  static_cast<long long>(bytes_a));
    }
  }
}

// links.between_regions_mbit shapes the data-parallel links between replicas of different regions
// (workers started with --region): one stage, a replica in each of two regions, fp32 ring
// all-reduce, every byte a replica sends crossing between the regions: the step's sync cannot
// take less than one replica's bytes at the rate, and without the shaping it takes milliseconds.
TEST_F(ReplicatedTest, LinksBetweenRegionsAreShapedAtTheirOwnRate) {
  c_.SetWorkerRegions({"eu", "us"});
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  constexpr double kMbit = 4;
  const std::string spec = R"(name: regions
model: {layers: 1, hidden: 32, heads: 2, context: 16}
stages: 1
replicas: 2
micro_batches: 2
micro_batch_size: 2
optimizer: {lr: 3.0e-3}
seed: 3
steps: 3
data_parallel: {codec: fp32, timeout: 60s}
links: {between_regions_mbit: 4}
)";
  absl::StatusOr<v1::JobStatus> st = Run(spec);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  ASSERT_EQ(st->stages_size(), 2);
  EXPECT_NE(st->stages(0).worker_name(), st->stages(1).worker_name());  // one in each region
  const double per_replica = static_cast<double>(st->dp_bytes_per_step()) / 2;
  const double at_rate = per_replica / (kMbit * 1e6 / 8);
  std::printf("fp32 ring between eu and us at %g Mbit/s: %.0f bytes per replica-step, %.3f s at the rate, sync %.3f s\n",
              kMbit, per_replica, at_rate, st->dp_seconds());
  EXPECT_GT(at_rate, 0.05);  // the check below means something
  EXPECT_GE(st->dp_seconds(), 0.9 * at_rate);
  // Two replicas: each sends all of its ring's bytes to the other, across the regions.
  EXPECT_EQ(st->dp_busiest_link_bytes(), st->dp_bytes_per_step() / 2);
  for (const v1::StagePlacement& sp : st->stages()) {  // each replica's own, in its slot
    EXPECT_EQ(sp.dp_sync().busiest_link_bytes(), st->dp_bytes_per_step() / 2) << "replica " << sp.replica();
    EXPECT_GE(sp.dp_sync().seconds(), 0.9 * at_rate) << "replica " << sp.replica();
    EXPECT_FALSE(sp.dp_sync().has_update());  // fp32: the ring all-reduce, then the executor's optimizer
  }
}

TEST_F(ReplicatedTest, MoreReplicasThanWorkersIsRejectedWithTheNumbers) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  ASSERT_TRUE(c_.WaitForIdleWorkers(3, absl::Seconds(30)).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec("2", "fp32", 3));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.status().message(), "needs 4 workers (2 stages x 2 replicas), 3 are idle, 3 registered");
  job = c_.Submit(Spec("[1, 4]", "fp32", 3));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(), "needs 5 workers (2 stages with replicas [1, 4]), 3 are idle, 3 registered");
}

}  // namespace
}  // namespace longhaul::cluster
