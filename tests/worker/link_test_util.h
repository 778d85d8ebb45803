// Shared by the data-plane tests: a StageLinkService on a loopback port whose one inbox takes job
// 1's frames from stage 0, a SenderOptions for it, and a client of the generated stub that sends
// hand-made (possibly hostile) chunks.
#ifndef LONGHAUL_TESTS_WORKER_LINK_TEST_UTIL_H_
#define LONGHAUL_TESTS_WORKER_LINK_TEST_UTIL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "longhaul/v1/data_plane.grpc.pb.h"
#include "worker/inbox.h"
#include "worker/link_sender.h"
#include "worker/link_service.h"

namespace longhaul::worker {

class OneInboxRouter : public InboxRouter {
 public:
  explicit OneInboxRouter(size_t capacity = 16) : inbox(std::make_shared<Inbox>(capacity, "stage 0 (test)")) {}
  absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int, int from_stage, int, absl::Duration) override {
    if (job_id != 1) return absl::FailedPreconditionError(absl::StrCat("not running job ", job_id));
    if (from_stage != 0) return absl::InvalidArgumentError("no link from that stage");
    return inbox;
  }
  std::shared_ptr<Inbox> inbox;
};

// `service` on a plaintext loopback server with a free port; its address in `*target` ("" when it
// did not start).
inline std::unique_ptr<grpc::Server> ServeOnLoopback(StageLinkService* service, std::string* target) {
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ConfigureLonghaulServer(&b);
  b.RegisterCallbackGenericService(service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  *target = port != 0 ? absl::StrCat("127.0.0.1:", port) : "";
  return server;
}

class LinkServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<StageLinkService>(&router_, /*max_frame_bytes=*/8 << 20);
    server_ = ServeOnLoopback(service_.get(), &target_);
    ASSERT_FALSE(target_.empty());
  }
  // Waits for every stream's handler (a test must not leave one blocked on a full inbox).
  void TearDown() override { server_->Shutdown(); }

  // A sender of job 1's stage 0 to this test's server.
  SenderOptions Opts(int streams = 1) const {
    SenderOptions o;
    o.target = target_;
    o.peer = "stage 1 (test)";
    o.job_id = 1;
    o.from_stage = 0;
    o.streams = streams;
    return o;
  }

  // Sends raw chunks through the generated stub and returns (final status, first ack error).
  std::pair<grpc::Status, std::string> SendRaw(const std::vector<v1::TensorFrameChunk>& chunks) {
    auto stub = v1::StageLink::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    for (const auto& c : chunks) {
      if (!stream->Write(c)) break;
    }
    stream->WritesDone();
    std::string err;
    v1::FrameAck ack;
    while (stream->Read(&ack)) {
      if (err.empty()) err = ack.error();
    }
    return {stream->Finish(), err};
  }

  // A chunk of job 1's stage 0, step 3, micro-batch 1, forward.
  static v1::TensorFrameChunk Chunk(const std::string& data, uint32_t index = 0, uint32_t count = 1,
                                    uint64_t frame_bytes = ~uint64_t{0}) {
    v1::TensorFrameChunk c;
    c.set_job_id(1);
    c.set_from_stage(0);
    c.set_step(3);
    c.set_micro_batch(1);
    c.set_direction(v1::DIRECTION_FORWARD);
    c.set_chunk_index(index);
    c.set_chunk_count(count);
    c.set_frame_bytes(frame_bytes == ~uint64_t{0} ? data.size() : frame_bytes);
    c.set_data(data);
    return c;
  }

  static stage_runtime::LinkMessage Tensor(uint64_t step, int micro_batch, torch::Tensor t) {
    stage_runtime::LinkMessage m;
    m.step = step;
    m.micro_batch = micro_batch;
    m.kind = stage_runtime::MessageKind::kActivation;
    m.tensor = std::move(t);
    return m;
  }
  static stage_runtime::LinkMessage Norm(uint64_t step, double value) {
    stage_runtime::LinkMessage m;
    m.step = step;
    m.kind = stage_runtime::MessageKind::kNormTotal;
    m.value = value;
    return m;
  }

  OneInboxRouter router_;
  std::unique_ptr<StageLinkService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_TESTS_WORKER_LINK_TEST_UTIL_H_
