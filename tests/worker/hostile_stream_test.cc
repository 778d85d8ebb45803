// Resource limits of the data plane's receiving side (docs/security.md): a stream may not announce
// a frame larger than its job's largest tensor, streams naming no job of this worker do not hold a
// thread each, and one peer may open only so many streams at once.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "tests/worker/link_test_util.h"

namespace longhaul::worker {
namespace {

TEST(FrameLimitFor, TheJobsLargestTensorBoundsAFrame) {
  // The demo's [8, 64, 128] activations: 256 KiB in fp32.
  const int64_t limit = FrameLimitFor(8, 64, 128);
  EXPECT_GE(limit, 8 * 64 * 128 * 4 + 64);
  EXPECT_LT(limit, 1 << 20);
  EXPECT_EQ(FrameLimitFor(65536, 65536, 65536), kDefaultMaxFrameBytes);
}

TEST(StreamAdmission, PerPeerAndWaitingLimits) {
  StreamAdmission a({.max_per_peer = 2, .max_waiting = 1, .wait = absl::Seconds(3)});
  auto t1 = a.Open("ipv4:10.0.0.1:1");
  auto t2 = a.Open("ipv4:10.0.0.1:2");
  ASSERT_TRUE(t1.ok() && t2.ok());
  auto t3 = a.Open("ipv4:10.0.0.1:3");
  ASSERT_FALSE(t3.ok());
  EXPECT_EQ(t3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(t3.status().message().find("more than 2 open data-plane streams from 10.0.0.1"), std::string::npos);
  EXPECT_TRUE(a.Open("ipv4:10.0.0.2:1").ok());  // another peer
  t1->reset();                                   // a stream ends: its place is free again
  EXPECT_TRUE(a.Open("ipv4:10.0.0.1:4").ok());
  EXPECT_EQ(a.BeginWait("ipv4:10.0.0.1:1"), absl::Seconds(3));
  EXPECT_EQ(a.BeginWait("ipv4:10.0.0.1:1"), absl::ZeroDuration());  // one waits already
  a.EndWait();
  EXPECT_EQ(a.BeginWait("ipv4:10.0.0.1:1"), absl::Seconds(3));
}

// A router whose inbox only takes frames up to `limit` bytes (as a stage's, FrameLimitFor).
class LimitedRouter : public InboxRouter {
 public:
  explicit LimitedRouter(int64_t limit) : inbox(std::make_shared<Inbox>(16, "stage 0 (test)", DecodeTarget{}, limit)) {}
  absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int, int, int, absl::Duration wait) override {
    if (job_id == 1) return inbox;
    absl::SleepFor(wait);  // as a worker waiting for an assignment that never comes
    return absl::FailedPreconditionError(absl::StrCat("not running job ", job_id));
  }
  std::shared_ptr<Inbox> inbox;
};

class HostileStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<StageLinkService>(&router_);  // the default 1 GiB service limit
    server_ = ServeOnLoopback(service_.get(), &target_);
    ASSERT_FALSE(target_.empty());
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status Send(const v1::TensorFrameChunk& c, std::string* err = nullptr) {
    auto stub = v1::StageLink::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    stream->Write(c);
    stream->WritesDone();
    v1::FrameAck ack;
    while (stream->Read(&ack)) {
      if (err != nullptr && err->empty()) *err = ack.error();
    }
    return stream->Finish();
  }

  static v1::TensorFrameChunk Chunk(uint64_t job, uint64_t frame_bytes) {
    v1::TensorFrameChunk c;
    c.set_job_id(job);
    c.set_from_stage(0);
    c.set_direction(v1::DIRECTION_FORWARD);
    c.set_chunk_count(1);
    c.set_frame_bytes(frame_bytes);
    c.set_data("0123456789abcdef");
    return c;
  }

  LimitedRouter router_{4096};
  std::unique_ptr<StageLinkService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(HostileStreamTest, AFrameLargerThanTheJobsLimitIsRefusedBeforeAllocation) {
  std::string err;
  grpc::Status s = Send(Chunk(1, uint64_t{512} << 20), &err);  // 512 MiB: below the service's 1 GiB
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("exceeds the limit of 4096"), std::string::npos) << err;
}

TEST_F(HostileStreamTest, StreamsForAJobNotRunningHereDoNotHoldThreads) {
  // 20 streams for a job this worker does not run, at once: a few may wait (briefly) for an
  // assignment in flight, the rest are refused at once.
  const int n = 20;
  std::atomic<int> fast{0}, refused{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&] {
      const absl::Time t0 = absl::Now();
      grpc::Status s = Send(Chunk(99, 16));
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) ++refused;
      if (absl::Now() - t0 < absl::Seconds(2)) ++fast;
    });
  }
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(refused.load(), n);
  EXPECT_GE(fast.load(), n - StreamAdmission::Limits{}.max_waiting);
  EXPECT_LT(absl::Now() - start, StreamAdmission::Limits{}.wait + absl::Seconds(5));
}

}  // namespace
}  // namespace longhaul::worker
