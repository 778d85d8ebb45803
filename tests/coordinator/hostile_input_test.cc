// Hostile input and resource limits at the coordinator (docs/security.md): per-client quotas on
// submissions and registrations, binary garbage as a spec, a model no worker can hold, and a
// worker that reports its stage finished before the planned step.
#include <string>

#include <gtest/gtest.h>

#include "coordinator/job_spec.h"
#include "coordinator/scheduler.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

TEST(PeerRateLimiter, BurstThenRateAndPerHost) {
  common::FakeClock clock;
  PeerRateLimiter l("job submissions", {2, 5}, &clock);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l.Take("ipv4:10.0.0.1:4000").ok()) << i;
  // A new connection (another port) of the same host draws on the same bucket.
  absl::Status s = l.Take("ipv4:10.0.0.1:4001");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("too many job submissions from 10.0.0.1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("try again in 500ms"), std::string::npos) << s;
  EXPECT_TRUE(l.Take("ipv4:10.0.0.2:4000").ok());  // another host has its own
  clock.Advance(absl::Milliseconds(500));
  EXPECT_TRUE(l.Take("ipv4:10.0.0.1:4002").ok());
  EXPECT_FALSE(l.Take("ipv4:10.0.0.1:4002").ok());
  PeerRateLimiter off("x", {0, 0}, &clock);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(off.Take("ipv4:1.1.1.1:1").ok());
}

TEST(PeerRateLimiter, PeerHost) {
  EXPECT_EQ(PeerRateLimiter::PeerHost("ipv4:127.0.0.1:5555"), "127.0.0.1");
  EXPECT_EQ(PeerRateLimiter::PeerHost("ipv6:[::1]:5555"), "::1");
  EXPECT_EQ(PeerRateLimiter::PeerHost("unix:/tmp/s"), "unix:/tmp/s");
}

TEST(HostileSpec, BinaryGarbageGetsAClearMessage) {
  const std::string garbage("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(garbage);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("job spec is not text"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("offset 0"), std::string::npos) << s.status();  // 0x89: not UTF-8
  s = ParseJobSpec(std::string("name: a\0b\n", 10));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("a control character: byte 0x00 at offset 7"), std::string::npos) << s.status();
  EXPECT_FALSE(CheckSpecText("\xed\xa0\x80").ok());  // a UTF-16 surrogate
  EXPECT_FALSE(CheckSpecText("\xc0\xaf").ok());      // overlong
  EXPECT_TRUE(CheckSpecText("name: \xc3\xa9t\xc3\xa9\tx\r\n").ok());
}

TEST(HostileSpec, MemoryEstimate) {
  absl::StatusOr<v1::JobSpec> demo = ParseJobSpec("name: d\n");
  ASSERT_TRUE(demo.ok());
  const MemoryEstimate small = EstimateStageMemory(*demo);
  EXPECT_LT(small.total_bytes(), 64 << 20);
  EXPECT_GT(small.total_bytes(), 16 * small.parameters);
  absl::StatusOr<v1::JobSpec> huge = ParseJobSpec("name: h\nmodel: {layers: 1024, hidden: 65536, heads: 64}\n");
  ASSERT_TRUE(huge.ok()) << huge.status();
  const MemoryEstimate e = EstimateStageMemory(*huge);
  // 256 layers of 12 h^2 parameters per stage, 16 bytes each: about 2.1e14 bytes.
  EXPECT_GT(e.total_bytes(), 2e14);
  EXPECT_NE(e.ToString(4).find("parameters; weights"), std::string::npos) << e.ToString(4);
}

class HostileCoordinatorTest : public ServiceFixture {};

TEST_F(HostileCoordinatorTest, AModelNoWorkerCanHoldIsRefusedWithTheEstimate) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml("name: huge\nmodel: {layers: 1024, hidden: 65536, heads: 64}\n");
  v1::SubmitJobResponse resp;
  grpc::Status s = svc_->SubmitJob(nullptr, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("the model does not fit a worker: stage 0 of 4"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("GiB needed at least, a worker has 81920 MiB"), std::string::npos)
      << s.error_message();
}

TEST_F(HostileCoordinatorTest, FinishedBeforeThePlannedStepIsAFailureNotSuccess) {
  FakeStage& a = Add("a");
  FakeStage& b = Add("b");
  const uint64_t job = Submit(2);  // 100 steps
  ASSERT_TRUE(a.Assigned(job, 0).has_value());
  ASSERT_TRUE(b.Assigned(job, 0).has_value());
  a.Progress(job, 0, 3, 0);
  a.SaysFinished(job, 0, 0, true);
  b.SaysFinished(job, 1, 0, true);  // no step at all
  const v1::JobStatus st = Job(job);
  EXPECT_NE(st.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(st.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(st.error().find("reported finished at step 3 of 100"), std::string::npos) << st.error();
}

TEST_F(HostileCoordinatorTest, SubmissionsAreThrottledPerClient) {
  // Over gRPC (the quota is per peer address; in-process calls have none).
  int accepted = 0, refused = 0;
  std::string message;
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_yaml("name: flood\nstages: 64\nmodel: {layers: 64}\n");  // waits: no workers
    v1::SubmitJobResponse resp;
    grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
    if (s.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      ++refused;
      message = s.error_message();
    }
  }
  // The fake clock does not move: exactly the burst is accepted.
  EXPECT_EQ(accepted, AdmissionLimits{}.submit.burst);
  EXPECT_EQ(refused, 300 - accepted);
  EXPECT_NE(message.find("too many job submissions from 127.0.0.1"), std::string::npos) << message;
}

TEST_F(HostileCoordinatorTest, RegistrationsAreThrottledPerClient) {
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    grpc::ClientContext ctx;
    v1::RegisterResponse resp;
    grpc::Status s = stub_->Register(&ctx, Registration(absl::StrCat("fake", i)), &resp);
    if (!s.ok()) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      ++refused;
    }
  }
  EXPECT_EQ(refused, 40 - static_cast<int>(AdmissionLimits{}.register_worker.burst));
}

}  // namespace
}  // namespace longhaul::coordinator
