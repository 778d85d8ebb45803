// Checkpoint copies between workers (worker/checkpoint_store.h): a real gRPC server with the
// CheckpointStore service next to the StageLink service, as on a worker; copies in and out, the
// size limit, a corrupted transfer, the replicator's reports, and the pruning of step files.
#include "worker/checkpoint_store.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/list_dir.h"
#include "proto/channel_config.h"
#include "worker/link_service.h"
#include "tests/worker/link_test_util.h"

namespace longhaul::worker {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/longhaul-ckstore-XXXXXX";
    dir_ = mkdtemp(tmpl);
    own_ = absl::StrCat(dir_, "/own");
    ASSERT_EQ(::mkdir(own_.c_str(), 0755), 0);
    svc_ = std::make_unique<CheckpointStoreService>(
        CheckpointStoreOptions{absl::StrCat(dir_, "/data"), /*max_bytes=*/8 << 20},
        [this](uint64_t job, int stage, int replica, int64_t step) {  // this worker ran replica 1 of job 7
          return job == 7 && replica == 1 ? StepCheckpointPath(own_, stage, step) : std::string();
        });
    link_ = std::make_unique<StageLinkService>(&router_);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    ConfigureLonghaulServer(&b);
    b.RegisterService(svc_.get());  // as the worker does: next to the generic StageLink service
    b.RegisterCallbackGenericService(link_.get());
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0);
    target_ = absl::StrCat("127.0.0.1:", port_);
    // 3 MiB and a bit: several chunks, the last a short one.
    payload_.resize((3 << 20) + 12345);
    for (size_t i = 0; i < payload_.size(); ++i) payload_[i] = static_cast<char>(i * 131 + 7);
  }
  // A Put of the one chunk c, as a hostile or broken sender might send it: the server's answer.
  grpc::Status PutOneChunk(const v1::CheckpointChunk& c) {
    auto stub = v1::CheckpointStore::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::PutCheckpointResponse resp;
    auto w = stub->Put(&ctx, &resp);
    if (!w->Write(c)) return w->Finish();  // the server ended the stream: its reason
    w->WritesDone();
    return w->Finish();
  }
  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    (void)common::RemoveTree(dir_);
  }

  std::string dir_, own_, target_;
  int port_ = 0;
  std::string payload_;
  OneInboxRouter router_;
  std::unique_ptr<StageLinkService> link_;
  std::unique_ptr<CheckpointStoreService> svc_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(CheckpointStoreTest, ACopyArrivesWholeAndComesBack) {
  const std::string src = absl::StrCat(dir_, "/src.safetensors");
  WriteAll(src, payload_);
  grpc::ClientContext ctx;
  absl::StatusOr<int64_t> n = PushCheckpoint(target_, "", src, 3, 1, 0, 40, &ctx);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(payload_.size()));
  const std::string replica = ReplicaPath(absl::StrCat(dir_, "/data"), 3, 1, 0, 40);
  EXPECT_EQ(replica, absl::StrCat(dir_, "/data/replicas/job-3/replica-0/stage-1.step-40.safetensors"));
  EXPECT_EQ(ReadAll(replica), payload_);
  // Fetched back (as a spare restoring the stage would).
  const std::string dest = absl::StrCat(dir_, "/restored.safetensors");
  absl::StatusOr<int64_t> got = FetchCheckpoint(target_, "", 3, 1, 0, 40, dest, 1 << 30);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(ReadAll(dest), payload_);
  // A checkpoint the worker wrote itself is found too, for the replica it ran only; an unknown one
  // is NOT_FOUND, nothing left.
  WriteAll(StepCheckpointPath(own_, 0, 5), "own");
  ASSERT_TRUE(FetchCheckpoint(target_, "", 7, 0, 1, 5, dest, 1 << 30).ok());
  EXPECT_EQ(ReadAll(dest), "own");
  const std::string none = absl::StrCat(dir_, "/none.safetensors");
  absl::StatusOr<int64_t> other = FetchCheckpoint(target_, "", 7, 0, 0, 5, none, 1 << 30);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << other.status();
  absl::StatusOr<int64_t> missing = FetchCheckpoint(target_, "", 3, 2, 0, 40, none, 1 << 30);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no checkpoint of job 3 stage 2 replica 0 step 40"), std::string::npos)
      << missing.status();
  EXPECT_FALSE(Exists(none));
  // The fetching side's own limit.
  absl::StatusOr<int64_t> big = FetchCheckpoint(target_, "", 3, 1, 0, 40, none, 1 << 20);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_FALSE(Exists(none));
}

TEST_F(CheckpointStoreTest, TooLargeOrCorruptedCopiesAreRefusedAndLeaveNothing) {
  const std::string src = absl::StrCat(dir_, "/big.safetensors");
  WriteAll(src, std::string(9 << 20, 'x'));  // the server takes 8 MiB
  grpc::ClientContext ctx;
  absl::StatusOr<int64_t> n = PushCheckpoint(target_, "", src, 3, 0, 0, 10, &ctx);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted) << n.status();
  EXPECT_NE(n.status().message().find("more than the limit"), std::string::npos) << n.status();
  EXPECT_FALSE(Exists(ReplicaPath(absl::StrCat(dir_, "/data"), 3, 0, 0, 10)));

  // A chunk altered on the way: the CRC32C catches it.
  v1::CheckpointChunk c;
  c.set_job_id(3);
  c.set_stage(0);
  c.set_step(20);
  c.set_total_bytes(8);
  c.set_data("abcdefgh");
  c.set_crc32c(12345);
  const grpc::Status s = PutOneChunk(c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(s.error_message().find("CRC32C mismatch"), std::string::npos) << s.error_message();
  EXPECT_FALSE(Exists(ReplicaPath(absl::StrCat(dir_, "/data"), 3, 0, 0, 20)));
}

TEST_F(CheckpointStoreTest, TheReplicatorReportsEachCopy) {
  const std::string src = absl::StrCat(dir_, "/src.safetensors");
  WriteAll(src, payload_);
  absl::Mutex mu;
  std::vector<v1::CheckpointReplicated> reports;
  {
    CheckpointReplicator r({9, "peer", target_}, 3, 2, 1, 1, [&](const v1::CheckpointReplicated& rep) {
      absl::MutexLock l(&mu);
      reports.push_back(rep);
    });
    r.Enqueue(5, src);
    r.Enqueue(10, absl::StrCat(dir_, "/missing.safetensors"));
    absl::MutexLock l(&mu);
    auto two = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return reports.size() >= 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)));
  }
  EXPECT_EQ(reports[0].step(), 5);
  EXPECT_EQ(reports[0].error(), "");
  EXPECT_EQ(reports[0].bytes(), static_cast<int64_t>(payload_.size()));
  EXPECT_EQ(reports[0].replica_worker_id(), 9u);
  EXPECT_EQ(reports[0].attempt(), 1);
  EXPECT_EQ(reports[0].replica(), 1);
  EXPECT_EQ(reports[1].step(), 10);
  EXPECT_NE(reports[1].error().find("copy to peer failed"), std::string::npos) << reports[1].error();
  EXPECT_EQ(ReadAll(ReplicaPath(absl::StrCat(dir_, "/data"), 3, 2, 1, 5)), payload_);
}

// With a sharded optimizer the replicas of a stage write different checkpoints: a worker holding
// copies of two replicas of one stage keeps both and serves each by its replica.
TEST_F(CheckpointStoreTest, CopiesOfTwoReplicasOfAStageAreKeptApart) {
  const std::string data = absl::StrCat(dir_, "/data");
  for (int replica : {0, 2}) {
    const std::string src = absl::StrCat(dir_, "/r", replica, ".safetensors");
    WriteAll(src, absl::StrCat("shard of replica ", replica));
    grpc::ClientContext ctx;
    ASSERT_TRUE(PushCheckpoint(target_, "", src, 5, 0, replica, 30, &ctx).ok());
  }
  for (int replica : {0, 2}) {
    EXPECT_EQ(ReadAll(ReplicaPath(data, 5, 0, replica, 30)), absl::StrCat("shard of replica ", replica));
    const std::string dest = absl::StrCat(dir_, "/fetched", replica, ".safetensors");
    ASSERT_TRUE(FetchCheckpoint(target_, "", 5, 0, replica, 30, dest, 1 << 30).ok());
    EXPECT_EQ(ReadAll(dest), absl::StrCat("shard of replica ", replica));
  }
  const std::string none = absl::StrCat(dir_, "/none.safetensors");
  EXPECT_EQ(FetchCheckpoint(target_, "", 5, 0, 1, 30, none, 1 << 30).status().code(), absl::StatusCode::kNotFound);
  // A negative replica is refused.
  v1::CheckpointChunk c;
  c.set_job_id(5);
  c.set_replica(-1);
  c.set_total_bytes(1);
  c.set_data("x");
  const grpc::Status s = PutOneChunk(c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("negative stage, replica or step"), std::string::npos) << s.error_message();
}

TEST_F(CheckpointStoreTest, StepFilesArePrunedToTheFloorKeepingTheNewest) {
  const std::string latest = absl::StrCat(own_, "/stage-1.safetensors");
  for (int step : {10, 20, 30}) {
    WriteAll(latest + ".tmp", absl::StrCat("step ", step));
    ASSERT_EQ(std::rename((latest + ".tmp").c_str(), latest.c_str()), 0);
    ASSERT_TRUE(KeepStepFile(latest, own_, 1, step).ok());
  }
  // Replaced by renaming, as the checkpoint writer does: the step files keep their steps.
  WriteAll(latest + ".tmp", "step 40");
  ASSERT_EQ(std::rename((latest + ".tmp").c_str(), latest.c_str()), 0);
  EXPECT_EQ(ReadAll(StepCheckpointPath(own_, 1, 20)), "step 20");
  WriteAll(StepCheckpointPath(own_, 2, 10), "another stage");
  EXPECT_EQ(PruneStepFiles(own_, 1, 20), 1);
  EXPECT_FALSE(Exists(StepCheckpointPath(own_, 1, 10)));
  EXPECT_TRUE(Exists(StepCheckpointPath(own_, 1, 20)));
  EXPECT_TRUE(Exists(StepCheckpointPath(own_, 2, 10)));  // not this stage's
  EXPECT_EQ(PruneStepFiles(own_, 1, 1000), 1);           // the newest always stays
  EXPECT_TRUE(Exists(StepCheckpointPath(own_, 1, 30)));
  // Replicas are pruned per stage the same way.
  for (int step : {5, 10}) {
    const std::string src = absl::StrCat(dir_, "/r.safetensors");
    WriteAll(src, "r");
    for (int replica : {0, 1}) {
      grpc::ClientContext ctx;
      ASSERT_TRUE(PushCheckpoint(target_, "", src, 4, 0, replica, step, &ctx).ok());
    }
  }
  svc_->Prune(4, 10);
  for (int replica : {0, 1}) {
    EXPECT_FALSE(Exists(ReplicaPath(absl::StrCat(dir_, "/data"), 4, 0, replica, 5)));
    EXPECT_TRUE(Exists(ReplicaPath(absl::StrCat(dir_, "/data"), 4, 0, replica, 10)));
  }
}

}  // namespace
}  // namespace longhaul::worker
