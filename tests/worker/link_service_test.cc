// The StageLink service against clients other than LinkSender: the generated v1::StageLink stub
// (the wire is the protocol, not our client), hostile chunk streams, bad metadata, and methods
// the generic service must refuse.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include "codec/codec.h"
#include "tests/worker/link_test_util.h"

namespace longhaul::worker {
namespace {

using LinkServiceTest = LinkServerTest;

TEST_F(LinkServiceTest, GeneratedStubClientIsServed) {
  auto codec = codec::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  const torch::Tensor x = torch::randn({16, 64});
  auto frame = (*codec)->Encode(x);
  ASSERT_TRUE(frame.ok());
  auto [st, err] = SendRaw({Chunk(*frame)});
  ASSERT_TRUE(st.ok()) << st.error_message() << " " << err;
  auto got = router_.inbox->Pop(absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 3u);
  EXPECT_EQ(got->micro_batch, 1);
  EXPECT_EQ(got->kind, stage_runtime::MessageKind::kActivation);
  EXPECT_TRUE(torch::equal(got->tensor, x));
}

TEST_F(LinkServiceTest, HostileFrameSizeIsRejectedBeforeAllocation) {
  auto [st, err] = SendRaw({Chunk("abc", 0, 1, uint64_t{1} << 40)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("exceeds the limit"), std::string::npos) << err;
  auto f = router_.inbox->Pop(absl::Seconds(5));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("bad frame from stage 0 (test)"), std::string::npos) << f.status();
}

TEST_F(LinkServiceTest, ChunksThatDoNotContinueTheFrameAreRejected) {
  auto [st, err] = SendRaw({Chunk("abcd", 0, 2, 8), Chunk("efgh", 2, 2, 8)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("does not continue frame"), std::string::npos) << err;
}

TEST_F(LinkServiceTest, MoreBytesThanAnnouncedAreRejected) {
  auto [st, err] = SendRaw({Chunk("abcdefgh", 0, 1, 4)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("more bytes than frame_bytes"), std::string::npos) << err;
}

TEST_F(LinkServiceTest, UnknownDirectionIsRejected) {
  v1::TensorFrameChunk c = Chunk("12345678");
  c.set_direction(static_cast<v1::Direction>(77));
  auto [st, err] = SendRaw({c});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("unknown direction 77"), std::string::npos) << err;
}

TEST_F(LinkServiceTest, CorruptCodecFrameIsRejectedWithTheCodecsReason) {
  auto codec = codec::MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  auto frame = (*codec)->Encode(torch::randn({4, 64}));
  ASSERT_TRUE(frame.ok());
  std::string bad = *frame;
  bad[bad.size() / 2] ^= 0x5a;
  auto [st, err] = SendRaw({Chunk(bad)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("CRC"), std::string::npos) << err;
}

// The receiver checksums each chunk as it copies it in (codec::FrameCrc): a frame split so that
// the first chunk ends inside the header is accepted intact, and a flipped bit in its header,
// first payload chunk or last chunk is still caught.
TEST_F(LinkServiceTest, ChecksumComputedOnArrivalCatchesCorruptionInAnyChunk) {
  auto codec = codec::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  const torch::Tensor x = torch::randn({16, 64});
  auto frame = (*codec)->Encode(x);
  ASSERT_TRUE(frame.ok());
  auto split = [](const std::string& f) {
    const size_t a = 20, b = f.size() / 2;  // a: inside the header
    return std::vector<v1::TensorFrameChunk>{Chunk(f.substr(0, a), 0, 3, f.size()), Chunk(f.substr(a, b - a), 1, 3, f.size()),
                                             Chunk(f.substr(b), 2, 3, f.size())};
  };
  {
    auto [st, err] = SendRaw(split(*frame));
    ASSERT_TRUE(st.ok()) << err;
    auto got = router_.inbox->Pop(absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(torch::equal(got->tensor, x));
  }
  for (size_t at : {size_t{13}, size_t{100}, frame->size() - 3}) {
    std::string bad = *frame;
    bad[at] ^= 0x10;
    auto [st, err] = SendRaw(split(bad));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << at;
    EXPECT_NE(err.find("CRC"), std::string::npos) << at << ": " << err;
  }
}

TEST_F(LinkServiceTest, BadNormFramesAreRejected) {
  v1::TensorFrameChunk c = Chunk("1234");
  c.set_direction(v1::DIRECTION_NORM_PARTIAL);
  auto [st, err] = SendRaw({c});
  EXPECT_NE(err.find("norm frame of 4 bytes"), std::string::npos) << err;
  double nan = std::nan("");
  std::string b(8, '\0');
  std::memcpy(b.data(), &nan, 8);
  OneInboxRouter fresh;
  router_.inbox = fresh.inbox;
  c = Chunk(b);
  c.set_direction(v1::DIRECTION_NORM_TOTAL);
  auto [st2, err2] = SendRaw({c});
  EXPECT_NE(err2.find("norm frame carries nan"), std::string::npos) << err2;
}

TEST_F(LinkServiceTest, UnknownJobIsRefused) {
  v1::TensorFrameChunk c = Chunk("x");
  c.set_job_id(99);
  auto [st, err] = SendRaw({c});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("not running job 99"), std::string::npos) << st.error_message();
}

TEST_F(LinkServiceTest, BadStripeMetadataIsRejected) {
  for (const char* bad : {"3/2", "0/9", "x", "1/0"}) {
    auto stub = v1::StageLink::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata(kStripeMetadata, bad);
    auto stream = stub->Stream(&ctx);
    stream->Write(Chunk("abcd"));
    stream->WritesDone();
    grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(st.error_message().find("longhaul-stripe"), std::string::npos) << bad << ": " << st.error_message();
  }
}

// A rejection ends the call from the server's side even while the client keeps its side open
// (a LinkSender learns of it from the ack, not from its own half-close).
TEST_F(LinkServiceTest, RejectionEndsTheCallWhileTheClientKeepsItOpen) {
  auto stub = v1::StageLink::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  ASSERT_TRUE(stream->Write(Chunk("abcdefgh", 0, 1, 4)));
  v1::FrameAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_NE(ack.error().find("more bytes than frame_bytes"), std::string::npos) << ack.error();
  EXPECT_EQ(ack.step(), 3u);
  EXPECT_EQ(ack.micro_batch(), 1u);
  EXPECT_FALSE(stream->Read(&ack));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
}

// The generic service sees every method the server is asked for; only StageLink/Stream is served.
TEST_F(LinkServiceTest, OtherMethodsAreUnimplementedAndNamed) {
  auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  grpc::Slice s(std::string("hello"));
  grpc::ByteBuffer req(&s, 1), resp;
  auto call = stub.PrepareUnaryCall(&ctx, "/longhaul.v1.StageLink/Upload", req, &cq);
  call->StartCall();
  grpc::Status st;
  int tag = 1;
  call->Finish(&resp, &st, &tag);
  void* got = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&got, &ok));
  EXPECT_EQ(got, &tag);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(st.error_message().find("/longhaul.v1.StageLink/Upload"), std::string::npos) << st.error_message();
  cq.Shutdown();
  while (cq.Next(&got, &ok)) {
  }
}

}  // namespace
}  // namespace longhaul::worker
