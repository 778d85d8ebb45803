// The data-plane link over real gRPC in one process: a LinkSender to a StageLinkService on a
// loopback port, through the Inbox.
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/codec.h"
#include "tests/worker/link_test_util.h"

namespace longhaul::worker {
namespace {

using stage_runtime::MessageKind;

using LinkTest = LinkServerTest;

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
    ASSERT_TRUE((*sender)->Send(Tensor(5, mb, sent.back()), mb == 0).ok());
  }
  ASSERT_TRUE((*sender)->Send(Norm(5, 42.5), false).ok());
  ASSERT_TRUE((*sender)->Finish().ok());
  std::vector<torch::Tensor> got;
  for (int mb = 0; mb < 3; ++mb) {
    auto f = router_.inbox->Pop(absl::Seconds(10));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->step, 5u);
    EXPECT_EQ(f->micro_batch, mb);
    EXPECT_EQ(f->kind, MessageKind::kActivation);
    EXPECT_TRUE(torch::equal(f->tensor, sent[mb]));
    got.push_back(f->tensor);
  }
  auto n = router_.inbox->Pop(absl::Seconds(10));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->kind, MessageKind::kNormTotal);
  EXPECT_FALSE(n->tensor.defined());
  EXPECT_EQ(n->value, 42.5);
  // fp32 tensors alias their reassembly buffers, which are recycled only once the tensor is gone:
  // the ones still held must be intact after the later frames arrived.
  for (int mb = 0; mb < 3; ++mb) EXPECT_TRUE(torch::equal(got[mb], sent[mb])) << mb;
  const stage_runtime::LinkStats st = (*sender)->stats();
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

TEST_F(LinkTest, EveryKindTravelsAsItself) {
  auto codec = codec::MakeCodec("fp16");
  ASSERT_TRUE(codec.ok());
  auto sender = LinkSender::Start(Opts(), codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  for (MessageKind k : {MessageKind::kActivation, MessageKind::kGradient, MessageKind::kNormPartial,
                        MessageKind::kNormTotal}) {
    stage_runtime::LinkMessage m;
    m.step = 2;
    m.kind = k;
    if (stage_runtime::CarriesTensor(k)) {
      m.micro_batch = 1;
      m.tensor = torch::ones({8, 8});
    } else {
      m.value = 7.25;
    }
    ASSERT_TRUE((*sender)->Send(std::move(m), true).ok()) << stage_runtime::MessageKindName(k);
  }
  ASSERT_TRUE((*sender)->Finish().ok());
  for (MessageKind k : {MessageKind::kActivation, MessageKind::kGradient, MessageKind::kNormPartial,
                        MessageKind::kNormTotal}) {
    auto m = router_.inbox->Pop(absl::Seconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->kind, k) << stage_runtime::MessageKindName(k);
    EXPECT_EQ(m->step, 2u);
    if (stage_runtime::CarriesTensor(k)) {
      EXPECT_EQ(m->micro_batch, 1);
      EXPECT_TRUE(torch::equal(m->tensor, torch::ones({8, 8})));
    } else {
      EXPECT_EQ(m->value, 7.25);
    }
  }
  EXPECT_EQ((*sender)->stats().error_samples, 2);  // norms have no round-trip error
}

TEST_F(LinkTest, MessagesThatDoNotFitTheirKindAreRefused) {
  auto codec = codec::MakeCodec("fp32");
  auto sender = LinkSender::Start(Opts(), codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  stage_runtime::LinkMessage no_tensor;
  no_tensor.kind = MessageKind::kGradient;
  absl::Status s = (*sender)->Send(no_tensor, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gradient message without a tensor"), std::string::npos) << s;
  stage_runtime::LinkMessage norm = Norm(1, 2.0);
  norm.tensor = torch::ones({2});
  s = (*sender)->Send(norm, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("with a tensor"), std::string::npos) << s;
  EXPECT_TRUE((*sender)->Finish().ok());  // refused messages do not break the link
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
    ASSERT_TRUE((*sender)->Send(Tensor(1, mb, torch::full({300, 1024}, float(mb))), false).ok());
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

// A paced link sends no faster than its pace (each chunk leaves at once, the next waits for it), in
// order and intact, on one stream (one pacer): more are refused.
TEST_F(LinkTest, PacedLinkKeepsItsPaceAndOrder) {
  auto codec = codec::MakeCodec("fp32");
  SenderOptions o = Opts(3);
  o.profile.pace_bytes_per_s = 10e6;
  absl::StatusOr<std::unique_ptr<LinkSender>> striped = LinkSender::Start(o, codec->get());
  ASSERT_FALSE(striped.ok());
  EXPECT_NE(std::string(striped.status().message()).find("one stream"), std::string::npos) << striped.status();
  o.streams = 1;
  auto sender = LinkSender::Start(o, codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  const absl::Time t0 = absl::Now();
  for (int mb = 0; mb < 6; ++mb) {
    ASSERT_TRUE((*sender)->Send(Tensor(1, mb, torch::full({300, 1024}, float(mb))), false).ok());
  }
  for (int mb = 0; mb < 6; ++mb) {
    auto f = router_.inbox->Pop(absl::Seconds(20));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->micro_batch, mb);
    EXPECT_EQ(f->tensor[0][0].item<float>(), float(mb));
  }
  // A lower bound only: 6 frames of 1.2 MB at 10 MB/s; nothing waits for the last chunk (1 MiB at
  // most) to be paid for.
  const double bytes = 6 * 300 * 1024 * 4.0;
  EXPECT_GE(absl::ToDoubleSeconds(absl::Now() - t0), (bytes - (1 << 20)) / 10e6 * 0.99);
  EXPECT_TRUE((*sender)->Finish().ok());
  EXPECT_GT((*sender)->stats().shaper_wait_seconds, 0);
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
        if (f->kind != MessageKind::kNormTotal || f->value != i) problems.push_back(absl::StrCat("norm at ", i));
        continue;
      }
      if (f->micro_batch != i || !torch::equal(f->tensor, sent[i])) problems.push_back(absl::StrCat("frame ", i));
    }
    auto end = router_.inbox->Pop(absl::Seconds(20));
    if (end.ok() || end.status().message().find("closed") == std::string::npos) problems.push_back("no close");
  });
  for (int i = 0; i < kFrames; ++i) {
    absl::Status st = (*sender)->Send(i % 10 == 9 ? Norm(1, i) : Tensor(1, i, sent[i]), false);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE((*sender)->Finish().ok());
  consumer.join();
  EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "; ");
  EXPECT_EQ((*sender)->stats().frames, kFrames - kFrames / 10);
}

// Through an inbox of one message and a slow consumer, every stream's reader has to stop reading
// when its chunk queue fills and start again when the assembler catches up: nothing is lost,
// duplicated or reordered.
TEST_F(LinkTest, ReaderPausesAndResumesBehindASlowConsumer) {
  router_.inbox = std::make_shared<Inbox>(1, "stage 0 (test)");
  auto codec = codec::MakeCodec("fp32");
  auto sender = LinkSender::Start(Opts(/*streams=*/2), codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  constexpr int kFrames = 12;
  std::thread producer([&] {
    for (int i = 0; i < kFrames; ++i) {
      // 2.5 MiB: three chunks per frame.
      if (!(*sender)->Send(Tensor(1, i, torch::full({640 * 1024}, float(i))), false).ok()) return;
    }
  });
  for (int i = 0; i < kFrames; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    auto f = router_.inbox->Pop(absl::Seconds(20));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->micro_batch, i);
    EXPECT_EQ(f->tensor[640 * 1024 - 1].item<float>(), float(i));
  }
  producer.join();
  EXPECT_TRUE((*sender)->Finish().ok());
}

// Cancellation on the sending side: a compute thread blocked in Send behind a peer that stopped
// taking frames (its inbox is full and nobody pops) wakes up with the abort reason, and the link
// stays failed.
TEST_F(LinkTest, AbortWakesASendBlockedBehindAStalledPeer) {
  router_.inbox = std::make_shared<Inbox>(1, "stage 0 (test)");
  auto codec = codec::MakeCodec("fp32");
  SenderOptions o = Opts();
  o.queue_capacity = 2;
  auto sender = LinkSender::Start(o, codec->get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  const torch::Tensor t = torch::ones({1 << 20});  // 4 MiB
  absl::Status last;
  int sent = 0;
  std::thread compute([&] {
    // Far more than the inbox, the chunk queue, the HTTP/2 windows and the send queue hold.
    for (; sent < 1000 && last.ok(); ++sent) last = (*sender)->Send(Tensor(1, sent, t), false);
  });
  absl::SleepFor(absl::Milliseconds(500));
  (*sender)->Abort(absl::AbortedError("stage cancelled by the test"));
  compute.join();
  EXPECT_LT(sent, 1000);
  EXPECT_EQ(last.code(), absl::StatusCode::kAborted) << last;
  absl::Status fin = (*sender)->Finish();
  EXPECT_EQ(fin.code(), absl::StatusCode::kAborted) << fin;
  // The receiving stream broke: the frames that got through come out in order, then a Pop says
  // the link broke.
  absl::StatusOr<stage_runtime::LinkMessage> f;
  int popped = 0;
  for (; popped <= sent && (f = router_.inbox->Pop(absl::Seconds(10))).ok(); ++popped) {
    EXPECT_EQ(f->micro_batch, popped);
  }
  EXPECT_GE(popped, 1);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("broke"), std::string::npos) << f.status();
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
