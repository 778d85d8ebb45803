// ReplicaSync's checkpoint state (worker/replica_sync.h, docs/recovery.md): a sharded codec's
// optimizer shard goes out with CheckpointState and comes back with RestoreState, which refuses
// what is not this replica's shard — a checkpoint file from disk or another worker is untrusted.
#include "worker/replica_sync.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "collective/in_process_transport.h"
#include "worker/link_settings.h"

namespace longhaul::worker {
namespace {

class ReplicaSyncRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stage_runtime::StageSpec spec;
    spec.model = {/*layers=*/1, /*hidden=*/32, /*heads=*/2, /*context=*/16, /*vocab=*/256};
    spec.layers = {0, 1};
    auto e = stage_runtime::StageExecutor::Create(spec);
    ASSERT_TRUE(e.ok()) << e.status();
    exec_ = std::move(*e);
    int64_t n = 0;
    for (const auto& [name, p] : exec_->parameters()) n += p.numel();
    len_ = collective::MakeShards(n, 2).length(1);
    ASSERT_GT(len_, 0);
    ReplicaSyncOptions o;
    o.rank = 1;
    o.regions = {"a", "b"};
    o.codec = collective::DpCodec::kSdp4Bit;
    auto rs = ReplicaSync::CreateOver(dp_.Connect(1), scalars_.Connect(1), o, exec_.get(), spec.optimizer);
    ASSERT_TRUE(rs.ok()) << rs.status();
    sync_ = std::move(*rs);
  }
  // Replica 1 of 2's shard, every tensor `len` elements of `dtype`.
  stage_runtime::TensorFile Shard(int64_t len, torch::Dtype dtype = torch::kFloat32) {
    stage_runtime::TensorFile f;
    f.tensors["main"] = torch::arange(len, dtype);
    f.tensors["exp_avg"] = torch::full({len}, 0.25, dtype);
    f.tensors["exp_avg_sq"] = torch::full({len}, 0.5, dtype);
    f.metadata = {{"codec", "sdp4bit"}, {"rank", "1"}, {"replicas", "2"}};
    return f;
  }
  void ExpectRefused(const stage_runtime::TensorFile& f, const std::string& words) {
    absl::Status s = sync_->RestoreState(f);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  }

  collective::InProcessHub dp_{2}, scalars_{2};
  std::unique_ptr<stage_runtime::StageExecutor> exec_;
  std::unique_ptr<ReplicaSync> sync_;
  int64_t len_ = 0;
};

TEST_F(ReplicaSyncRestoreTest, TheShardComesBackAsItWasSaved) {
  ASSERT_TRUE(sync_->RestoreState(Shard(len_)).ok());
  const stage_runtime::TensorFile out = sync_->CheckpointState();
  ASSERT_EQ(out.tensors.size(), 3u);
  EXPECT_TRUE(torch::equal(out.tensors.at("main"), torch::arange(len_, torch::kFloat32)));
  EXPECT_TRUE(torch::equal(out.tensors.at("exp_avg_sq"), torch::full({len_}, 0.5f)));
  EXPECT_EQ(out.metadata.at("rank"), "1");
  EXPECT_EQ(out.metadata.at("replicas"), "2");
  EXPECT_EQ(out.metadata.at("codec"), "sdp4bit");
}

TEST_F(ReplicaSyncRestoreTest, AnythingButThisReplicasShardIsRefusedNamingIt) {
  ExpectRefused({}, "no sharded optimizer state for replica 1 of 2 (data_parallel.codec sdp4bit)");
  stage_runtime::TensorFile other = Shard(len_);
  other.metadata["rank"] = "0";
  ExpectRefused(other, "holds the optimizer shard of replica 0 of 2 (sdp4bit), not of replica 1 of 2");
  other = Shard(len_);
  other.metadata["codec"] = "zeropp";
  ExpectRefused(other, "(zeropp), not of replica 1 of 2 (data_parallel.codec sdp4bit)");
  other = Shard(len_);
  other.metadata.erase("replicas");
  ExpectRefused(other, "of replica 1 of (none)");
  ExpectRefused(Shard(len_ + 1), absl::StrCat("is missing or not ", len_, " fp32 elements"));
  ExpectRefused(Shard(len_, torch::kFloat64), "fp32 elements");
  other = Shard(len_);
  other.tensors.erase("exp_avg");
  ExpectRefused(other, "holds 2 optimizer shard tensors");
  other = Shard(len_);
  other.tensors["extra"] = torch::zeros({1});
  ExpectRefused(other, "holds 4 optimizer shard tensors");
  // Nothing was taken from the refused ones: the state is still empty.
  EXPECT_EQ(sync_->CheckpointState().tensors.at("main").numel(), 0);
}

// The replicas' links from the spec's links: section (worker/link_settings.h): none without
// emulation or a pace; a pace alone paces every link; links between regions emulated at
// between_regions_mbit are not paced as well, those within the region are.
TEST(ReplicaLinkProfilesTest, EmulatedOrPacedPerPeer) {
  const std::vector<std::string> regions = {"eu", "eu", "us"};
  v1::LinkSpec none;
  absl::StatusOr<std::vector<netem::LinkProfile>> l = ReplicaLinkProfiles(none, regions, 0, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->empty());
  v1::LinkSpec paced;
  paced.set_pace_mbit(80);
  l = ReplicaLinkProfiles(paced, regions, 0, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->size(), 3u);
  for (const netem::LinkProfile& p : *l) {
    EXPECT_TRUE(p.paced());
    EXPECT_DOUBLE_EQ(p.pace_bytes_per_s, 10e6);
  }
  paced.set_between_regions_mbit(8);
  l = ReplicaLinkProfiles(paced, regions, 0, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE((*l)[1].paced());
  EXPECT_FALSE((*l)[2].paced());
  EXPECT_TRUE((*l)[2].shaped());
  EXPECT_DOUBLE_EQ((*l)[2].rate_bytes_per_s, 1e6);
  absl::StatusOr<std::vector<netem::LinkProfile>> bad = ReplicaLinkProfiles(paced, regions, 3, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("replica 3 of a group of 3"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace longhaul::worker
