// The data-plane link over real gRPC in one process: a StageLinkService on a loopback port, a
// LinkSender, and hand-made hostile chunk streams.
#include "worker/link.h"

#include <cstring>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/codec.h"

namespace longhaul::worker {
namespace {

class OneInboxRouter : public InboxRouter {
 public:
  OneInboxRouter() : inbox(std::make_shared<Inbox>(16, "stage 0 (test)")) {}
  absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int from_stage, absl::Duration) override {
    if (job_id != 1) return absl::FailedPreconditionError(absl::StrCat("not running job ", job_id));
    if (from_stage != 0) return absl::InvalidArgumentError("no link from that stage");
    return inbox;
  }
  std::shared_ptr<Inbox> inbox;
};

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<StageLinkService>(&router_, /*max_frame_bytes=*/8 << 20);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize(kMaxMessageBytes);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(port_, 0);
    target_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override { server_->Shutdown(); }

  // Sends raw chunks and returns (final status, first ack error).
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

  OneInboxRouter router_;
  std::unique_ptr<StageLinkService> service_;
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

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string target_;
};

TEST_F(LinkTest, TensorsAndNormsArriveInOrderAndIntact) {
  auto codec = codec::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  auto sender = LinkSender::Start(Opts(), codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  torch::manual_seed(1);
  // 3 MiB tensors span several 1 MiB chunks.
  std::vector<torch::Tensor> sent;
  for (int mb = 0; mb < 3; ++mb) {
    sent.push_back(torch::randn({768, 1024}));
    ASSERT_TRUE((*sender)->Send(5, mb, v1::DIRECTION_FORWARD, sent.back(), mb == 0).ok());
  }
  ASSERT_TRUE((*sender)->SendValue(5, v1::DIRECTION_NORM_TOTAL, 42.5).ok());
  ASSERT_TRUE((*sender)->Finish().ok());
  std::vector<torch::Tensor> got;
  for (int mb = 0; mb < 3; ++mb) {
    auto f = router_.inbox->Pop(absl::Seconds(10));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->step, 5u);
    EXPECT_EQ(f->micro_batch, mb);
    EXPECT_TRUE(torch::equal(f->tensor, sent[mb]));
    got.push_back(f->tensor);
  }
  auto n = router_.inbox->Pop(absl::Seconds(10));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->direction, v1::DIRECTION_NORM_TOTAL);
  EXPECT_EQ(n->value, 42.5);
  // fp32 tensors alias their reassembly buffers, which are recycled only once the tensor is gone:
  // the ones still held must be intact after the later frames arrived.
  for (int mb = 0; mb < 3; ++mb) EXPECT_TRUE(torch::equal(got[mb], sent[mb])) << mb;
  const LinkStats st = (*sender)->stats();
  EXPECT_EQ(st.frames, 3);
  EXPECT_EQ(st.raw_bytes, 3 * 768 * 1024 * 4);
  EXPECT_GT(st.wire_bytes, st.raw_bytes);  // fp32 frames carry a header
  EXPECT_EQ(st.error_samples, 1);
  EXPECT_EQ(st.sum_rel_error, 0.0);
  // The sender closed cleanly: the inbox is closed and says so.
  auto end = router_.inbox->Pop(absl::Seconds(10));
  ASSERT_FALSE(end.ok());
  EXPECT_NE(end.status().message().find("closed"), std::string::npos) << end.status();
}

TEST_F(LinkTest, DelayedLinkDeliversEverythingInOrderNoEarlierThanTheDelay) {
  auto codec = codec::MakeCodec("fp32");
  SenderOptions o = Opts();
  o.profile.delay = absl::Milliseconds(80);
  o.profile.jitter = absl::Milliseconds(20);
  o.profile.loss = 0.2;
  o.profile.retransmit = absl::Milliseconds(50);
  auto sender = LinkSender::Start(o, codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  const absl::Time t0 = absl::Now();
  for (int mb = 0; mb < 6; ++mb) {
    ASSERT_TRUE((*sender)->Send(1, mb, v1::DIRECTION_FORWARD, torch::full({300, 1024}, float(mb)), false).ok());
  }
  auto first = router_.inbox->Pop(absl::Seconds(20));
  ASSERT_TRUE(first.ok()) << first.status();
  // A lower bound only (a correctness property of the delay line, not a speed assertion).
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(60));
  EXPECT_EQ(first->micro_batch, 0);
  for (int mb = 1; mb < 6; ++mb) {
    auto f = router_.inbox->Pop(absl::Seconds(20));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->micro_batch, mb);
    EXPECT_EQ(f->tensor[0][0].item<float>(), float(mb));
  }
  EXPECT_TRUE((*sender)->Finish().ok());
}

TEST_F(LinkTest, HostileFrameSizeIsRejectedBeforeAllocation) {
  auto [st, err] = SendRaw({Chunk("abc", 0, 1, uint64_t{1} << 40)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("exceeds the limit"), std::string::npos) << err;
  auto f = router_.inbox->Pop(absl::Seconds(5));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("bad frame from stage 0 (test)"), std::string::npos) << f.status();
}

TEST_F(LinkTest, ChunksThatDoNotContinueTheFrameAreRejected) {
  auto [st, err] = SendRaw({Chunk("abcd", 0, 2, 8), Chunk("efgh", 2, 2, 8)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("does not continue frame"), std::string::npos) << err;
}

TEST_F(LinkTest, MoreBytesThanAnnouncedAreRejected) {
  auto [st, err] = SendRaw({Chunk("abcdefgh", 0, 1, 4)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(err.find("more bytes than frame_bytes"), std::string::npos) << err;
}

TEST_F(LinkTest, CorruptCodecFrameIsRejectedWithTheCodecsReason) {
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
TEST_F(LinkTest, ChecksumComputedOnArrivalCatchesCorruptionInAnyChunk) {
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

TEST_F(LinkTest, BadNormFramesAreRejected) {
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

TEST_F(LinkTest, UnknownJobIsRefused) {
  v1::TensorFrameChunk c = Chunk("x");
  c.set_job_id(99);
  auto [st, err] = SendRaw({c});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("not running job 99"), std::string::npos) << st.error_message();
}

// A link striped over 3 streams (3 TCP connections): frames of very different sizes (1 KiB and
// 1.5 MiB, so the streams run at different speeds) and norm values come out in the sender's order
// and intact while a consumer pops concurrently through an inbox smaller than the traffic; after a
// clean Finish the inbox reports the link closed.
TEST_F(LinkTest, StripedLinkKeepsTheSendersOrder) {
  auto codec = codec::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  auto sender = LinkSender::Start(Opts(/*streams=*/3), codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  torch::manual_seed(2);
  constexpr int kFrames = 40;
  std::vector<torch::Tensor> sent;
  for (int i = 0; i < kFrames; ++i) sent.push_back(torch::randn({i % 3 == 1 ? 384 * 1024 : 256}));
  std::vector<std::string> problems;
  std::thread consumer([&] {
    for (int i = 0; i < kFrames; ++i) {
      auto f = router_.inbox->Pop(absl::Seconds(20));
      if (!f.ok()) {
        problems.push_back(std::string(f.status().message()));
        return;
      }
      if (i % 10 == 9) {
        if (f->direction != v1::DIRECTION_NORM_TOTAL || f->value != i) problems.push_back(absl::StrCat("norm at ", i));
        continue;
      }
      if (f->micro_batch != i || !torch::equal(f->tensor, sent[i])) problems.push_back(absl::StrCat("frame ", i));
    }
    auto end = router_.inbox->Pop(absl::Seconds(20));
    if (end.ok() || end.status().message().find("closed") == std::string::npos) problems.push_back("no close");
  });
  for (int i = 0; i < kFrames; ++i) {
    absl::Status st = i % 10 == 9 ? (*sender)->SendValue(1, v1::DIRECTION_NORM_TOTAL, i)
                                  : (*sender)->Send(1, i, v1::DIRECTION_FORWARD, sent[i], false);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE((*sender)->Finish().ok());
  consumer.join();
  EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "; ");
  EXPECT_EQ((*sender)->stats().frames, kFrames - kFrames / 10);
}

TEST_F(LinkTest, BadStripeMetadataIsRejected) {
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

// Stripes are taken in turn: a frame waiting on stream 1 is not popped before stream 0's; a stream
// that closed cleanly fails the Pop that needs a frame from it, after the frames queued before.
TEST(InboxTest, StripesArePoppedInTurnAndCloseSeparately) {
  Inbox in(4, "stage 0 (test)");
  ASSERT_TRUE(in.SetStripes(2));
  EXPECT_FALSE(in.SetStripes(3));
  EXPECT_TRUE(in.SetStripes(2));
  InFrame a, b, c;
  a.micro_batch = 0, b.micro_batch = 1, c.micro_batch = 2;
  ASSERT_TRUE(in.Push(b, 1));
  EXPECT_FALSE(in.Pop(absl::Milliseconds(20)).ok());  // frame 0 (stream 0) has not come
  ASSERT_TRUE(in.Push(a, 0));
  ASSERT_TRUE(in.Push(c, 0));
  in.Close(absl::OkStatus(), 1);
  for (int want : {0, 1, 2}) {
    auto f = in.Pop(absl::Seconds(1));
    ASSERT_TRUE(f.ok()) << want << ": " << f.status();
    EXPECT_EQ(f->micro_batch, want);
  }
  auto end = in.Pop(absl::Seconds(1));  // frame 3 would come on the closed stream 1
  ASSERT_FALSE(end.ok());
  EXPECT_NE(end.status().message().find("closed"), std::string::npos) << end.status();
}

TEST(InboxTest, CancelWakesAWaitingPopAndTimeoutNamesThePeer) {
  Inbox in(2, "stage 4 (worker w9 at h:1)");
  auto t = in.Pop(absl::Milliseconds(20));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no frame from stage 4 (worker w9"), std::string::npos);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    in.Cancel(absl::CancelledError("job cancelled"));
  });
  auto c = in.Pop(absl::Seconds(30));
  canceller.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(in.Push(InFrame{}));
}

TEST(LinkSenderTest, UnreachablePeerIsAClearError) {
  auto codec = codec::MakeCodec("fp32");
  SenderOptions o;
  o.target = "127.0.0.1:1";
  o.peer = "stage 2 (worker gone at 127.0.0.1:1)";
  o.connect_timeout = absl::Milliseconds(300);
  auto s = LinkSender::Start(o, codec->get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot connect to stage 2 (worker gone"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace longhaul::worker
