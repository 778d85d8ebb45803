// The transports (collective/transport.h): messages of any size arrive intact and in order per
// (sender, tag), counters add up, the gRPC service refuses hostile and malformed chunks with
// clear errors, link shaping paces a sender, and a dead peer is an error naming it within the
// deadline.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "codec/crc32c.h"
#include "collective/grpc_transport.h"
#include "tests/collective/harness.h"

namespace longhaul::collective {
namespace {

using testing::Cluster;
using testing::Kind;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class TransportTest : public ::testing::TestWithParam<Kind> {};

TEST_P(TransportTest, MessagesOfAnySizeArriveIntactAndInOrder) {
  Cluster c(GetParam(), {"a", "a", "b"});
  const std::vector<size_t> sizes = {0, 1, 1000, (1 << 20) - 1, 1 << 20, (3 << 20) + 17};
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(c.transport(0).Send(2, 7, RandomBytes(sizes[i], static_cast<uint32_t>(i)), deadline).ok());
  }
  ASSERT_TRUE(c.transport(1).Send(2, 9, "other tag", deadline).ok());
  // Tag 9 first although it was sent last: messages are matched by (sender, tag).
  absl::StatusOr<std::string> m = c.transport(2).Recv(1, 9, deadline);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, "other tag");
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    m = c.transport(2).Recv(0, 7, deadline);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, RandomBytes(sizes[i], static_cast<uint32_t>(i))) << "message " << i;
    total += static_cast<int64_t>(sizes[i]);
  }
  const TransportCounters sent = c.transport(0).counters(), got = c.transport(2).counters();
  EXPECT_EQ(sent.messages_sent, static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(sent.bytes_sent, total);
  EXPECT_GE(sent.wire_bytes_sent, total);
  EXPECT_EQ(got.messages_received, static_cast<int64_t>(sizes.size()) + 1);
  EXPECT_EQ(got.bytes_received, total + 9);
}

TEST_P(TransportTest, RecvTimesOutNamingThePeerAndSelfSendsAreRefused) {
  Cluster c(GetParam(), {"a", "a"});
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> m = c.transport(0).Recv(1, 1, t0 + absl::Milliseconds(200));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(m.status().message(), "rank 1")) << m.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(c.transport(0).Send(0, 1, "x", absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.transport(0).Send(5, 1, "x", absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, OversizedMessagesAreRefused) {
  testing::ClusterOptions o;
  o.max_message_bytes = 1000;
  Cluster c(GetParam(), {"a", "a"}, o);
  absl::Status s = c.transport(0).Send(1, 1, std::string(1001, 'x'), absl::Now() + absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "limit of 1000")) << s;
  EXPECT_TRUE(c.transport(0).Send(1, 2, std::string(1000, 'x'), absl::Now() + absl::Seconds(5)).ok());
}

TEST_P(TransportTest, AbortFailsThePeersPendingReceives) {
  Cluster c(GetParam(), {"a", "b", "b"});
  absl::Status got;
  std::thread waiter([&] { got = c.transport(2).Recv(1, 3, absl::Now() + absl::Seconds(20)).status(); });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time t0 = absl::Now();
  c.transport(0).Abort(absl::UnavailableError("rank 7 is gone"));
  waiter.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted) << got;
  EXPECT_TRUE(absl::StrContains(got.message(), "rank 0 aborted")) << got;
  EXPECT_TRUE(absl::StrContains(got.message(), "rank 7 is gone")) << got;
}

TEST_P(TransportTest, ShapedLinksPaceTheSender) {
  testing::ClusterOptions o;
  o.link.rate_bytes_per_s = 2e6;  // 16 Mbit/s
  o.link.delay = absl::Milliseconds(30);
  Cluster c(GetParam(), {"a", "b"}, o);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.transport(0).Send(1, 1, std::string(500000, 'x'), t0 + absl::Seconds(10)).ok());
  const absl::Duration took = absl::Now() - t0;
  // 0.25 s of serialisation plus 30 ms of delay.
  EXPECT_GE(took, absl::Milliseconds(260)) << took;
  EXPECT_LT(took, absl::Seconds(3)) << took;
  // A deadline shorter than the link needs is an error, not a late success.
  absl::Status s = c.transport(0).Send(1, 2, std::string(500000, 'x'), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// A paced link (a real one: LinkProfile::paced) sends over gRPC no faster than its pace, and
// intact; the in-process transport has no network to pace.
TEST_P(TransportTest, PacedLinksSendNoFasterThanThePace) {
  testing::ClusterOptions o;
  o.link.pace_bytes_per_s = 2e6;  // 16 Mbit/s
  Cluster c(GetParam(), {"a", "b"}, o);
  const std::string msg(3 << 20, 'p');
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.transport(0).Send(1, 1, msg, t0 + absl::Seconds(20)).ok());
  absl::StatusOr<std::string> got = c.transport(1).Recv(0, 1, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, msg);
  if (GetParam() == Kind::kGrpc) {
    // A lower bound only: three 1 MiB chunks, nothing waiting for the last to be paid for.
    EXPECT_GE(absl::Now() - t0, absl::Seconds((2 << 20) / 2e6 * 0.99));
  }
}

TEST_P(TransportTest, SendToADeadPeerFailsWithinTheDeadlineNamingIt) {
  Cluster c(GetParam(), {"a", "a", "a"});
  c.Kill(2);
  const absl::Time t0 = absl::Now();
  absl::Status s = c.transport(0).Send(2, 1, "x", t0 + absl::Seconds(1));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2")) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  const std::vector<std::string> dead = c.transport(0).UnreachablePeers(absl::Now() + absl::Seconds(1));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_TRUE(absl::StrContains(dead[0], "rank 2")) << dead[0];
}

// Rank 0 sends `bytes` to `peer` with a 60 s deadline and aborts 0.3 s later ("the job was
// cancelled"); the send's outcome and how long it took from the start.
std::pair<absl::Status, absl::Duration> SendThenAbort(Cluster& c, int peer, size_t bytes) {
  absl::Status got;
  const absl::Time t0 = absl::Now();
  std::thread sender([&] { got = c.transport(0).Send(peer, 1, std::string(bytes, 'x'), t0 + absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));
  c.transport(0).Abort(absl::CancelledError("the job was cancelled"));
  sender.join();
  return {got, absl::Now() - t0};
}

// A replica stuck sending to a dead peer (over gRPC: waiting for its server to come back) must end
// when its own stage is cancelled, not at the message's deadline.
TEST_P(TransportTest, AbortEndsThisRanksSendToADeadPeer) {
  Cluster c(GetParam(), {"a", "a", "a"});
  c.Kill(2);
  const auto [got, took] = SendThenAbort(c, 2, 100000);
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_FALSE(got.ok());
  EXPECT_TRUE(absl::StrContains(got.message(), "rank 2")) << got;
  if (GetParam() == Kind::kGrpc) {
    EXPECT_EQ(got.code(), absl::StatusCode::kCancelled) << got;
    EXPECT_TRUE(absl::StrContains(got.message(), "the job was cancelled")) << got;
  }
}

// A send waiting for its emulated link to deliver (here a 20 s one-way delay) ends at this rank's
// Abort with the reason, not when the link would have delivered.
TEST_P(TransportTest, AbortEndsThisRanksWaitForTheShapedLink) {
  testing::ClusterOptions o;
  o.link.rate_bytes_per_s = 1e8;
  o.link.delay = absl::Seconds(20);
  Cluster c(GetParam(), {"a", "b"}, o);
  const auto [got, took] = SendThenAbort(c, 1, 1000);
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_FALSE(got.ok());
  EXPECT_TRUE(absl::StrContains(got.message(), "the job was cancelled")) << got;
  EXPECT_TRUE(absl::StrContains(got.message(), "rank 1")) << got;
}

INSTANTIATE_TEST_SUITE_P(Both, TransportTest, ::testing::Values(Kind::kInProcess, Kind::kGrpc),
                         [](const ::testing::TestParamInfo<Kind>& i) { return testing::KindName(i.param); });

// ------------------------------------------------------------------ hostile chunks (gRPC only)

class HostileChunkTest : public ::testing::Test {
 protected:
  HostileChunkTest() : c_(Kind::kGrpc, {"a", "a"}) {
    stub_ = v1::Collective::NewStub(grpc::CreateCustomChannel(c_.address(1), grpc::InsecureChannelCredentials(),
                                                              LonghaulChannelArgs()));
  }

  v1::CollectiveChunk Header(uint64_t total, uint32_t count, absl::string_view data_for_crc) {
    v1::CollectiveChunk h;
    h.set_group("test-group");
    h.set_from_rank(0);
    h.set_to_rank(1);
    h.set_tag(5);
    h.set_total_bytes(total);
    h.set_chunk_count(count);
    h.set_crc32c(codec::Crc32c(data_for_crc.data(), data_for_crc.size()));
    return h;
  }

  // Sends the chunks as one call; returns the receiver's answer.
  grpc::Status SendRaw(const std::vector<v1::CollectiveChunk>& chunks) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::CollectiveAck ack;
    auto w = stub_->Send(&ctx, &ack);
    for (const auto& ch : chunks) {
      if (!w->Write(ch)) break;
    }
    w->WritesDone();
    return w->Finish();
  }

  // The receiver (rank 1) must see the problem on its next receive from rank 0, at once.
  void ExpectReceiverPoisoned(absl::string_view what) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::string> m = c_.transport(1).Recv(0, 5, t0 + absl::Seconds(5));
    EXPECT_FALSE(m.ok());
    EXPECT_TRUE(absl::StrContains(m.status().message(), what)) << m.status();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  }

  Cluster c_;
  std::unique_ptr<v1::Collective::Stub> stub_;
};

TEST_F(HostileChunkTest, AHugeDeclaredSizeIsRefusedBeforeAllocating) {
  v1::CollectiveChunk ch = Header(uint64_t{1} << 62, 1, "");
  grpc::Status s = SendRaw({ch});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "exceed the limit")) << s.error_message();
  ExpectReceiverPoisoned("exceed the limit");
}

TEST_F(HostileChunkTest, WrongChunkCountsSizesAndOrderAreRefused) {
  const std::string data(3000, 'd');
  {
    v1::CollectiveChunk ch = Header(3000, 2, data);  // 3000 bytes are one chunk
    ch.set_data(data);
    grpc::Status s = SendRaw({ch});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "2 chunks for 3000 bytes")) << s.error_message();
  }
  {
    v1::CollectiveChunk ch = Header(3000, 1, data);
    ch.set_data(data.substr(0, 2999));  // one byte short
    grpc::Status s = SendRaw({ch});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "carries 2999 bytes, expected 3000")) << s.error_message();
  }
  {
    const std::string big((1 << 20) + 10, 'b');
    v1::CollectiveChunk a = Header(big.size(), 2, big), b = a;
    a.set_chunk_index(1);  // out of order
    a.set_data(big.substr(1 << 20));
    grpc::Status s = SendRaw({a});
    EXPECT_TRUE(absl::StrContains(s.error_message(), "chunk 1 where chunk 0 was due")) << s.error_message();
    a.set_chunk_index(0);
    a.set_data(big.substr(0, 1 << 20));
    b.set_chunk_index(1);
    b.set_tag(6);  // header changes between chunks
    b.set_data(big.substr(1 << 20));
    s = SendRaw({a, b});
    EXPECT_TRUE(absl::StrContains(s.error_message(), "header differs")) << s.error_message();
    s = SendRaw({a});  // ends early
    EXPECT_TRUE(absl::StrContains(s.error_message(), "ended after 1 of 2 chunks")) << s.error_message();
  }
  {
    v1::CollectiveChunk ch = Header(3000, 1, data);
    ch.set_data(data);
    grpc::Status s = SendRaw({ch, ch});  // a chunk after the last
    EXPECT_TRUE(absl::StrContains(s.error_message(), "after the last")) << s.error_message();
  }
  ExpectReceiverPoisoned("refused");
}

TEST_F(HostileChunkTest, ACorruptedPayloadFailsTheChecksum) {
  const std::string data(3000, 'd');
  v1::CollectiveChunk ch = Header(3000, 1, data);
  std::string bad = data;
  bad[1234] ^= 1;
  ch.set_data(bad);
  grpc::Status s = SendRaw({ch});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  ExpectReceiverPoisoned("CRC32C");
}

TEST_F(HostileChunkTest, UnknownGroupsAndRanksAreRefused) {
  v1::CollectiveChunk ch = Header(0, 1, "");
  ch.set_group("no-such-group");
  EXPECT_EQ(SendRaw({ch}).error_code(), grpc::StatusCode::NOT_FOUND);
  ch.set_group(std::string(300, 'g'));
  EXPECT_EQ(SendRaw({ch}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ch = Header(0, 1, "");
  ch.set_from_rank(9);
  grpc::Status s = SendRaw({ch});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "from rank 9")) << s.error_message();
  ch.set_from_rank(1);  // to itself
  EXPECT_EQ(SendRaw({ch}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A chunk above gRPC's message limit never reaches the service.
  ch = Header(5 << 20, 5, "");
  ch.set_data(std::string(5 << 20, 'x'));
  EXPECT_EQ(SendRaw({ch}).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // An empty call.
  EXPECT_EQ(SendRaw({}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // None of these named a known sender: a well-formed message still goes through.
  ASSERT_TRUE(c_.transport(0).Send(1, 5, "fine", absl::Now() + absl::Seconds(5)).ok());
  absl::StatusOr<std::string> m = c_.transport(1).Recv(0, 5, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, "fine");
}

// A member whose stage starts later registers its rank after the first message to it went out:
// the sender tries again until the deadline, and the message arrives.
TEST_F(HostileChunkTest, AMessageWaitsForAPeerThatJoinsTheGroupLate) {
  auto make = [&](int rank) {
    GrpcTransportOptions o;
    o.group = "late-group";
    o.rank = rank;
    o.addresses = {c_.address(0), c_.address(1)};
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t = GrpcTransport::Create(c_.service(rank), o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  };
  std::unique_ptr<GrpcTransport> early = make(0);
  ASSERT_NE(early, nullptr);
  absl::Status sent;
  std::thread sender([&] { sent = early->Send(1, 3, "hello", absl::Now() + absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(300));
  std::unique_ptr<GrpcTransport> late = make(1);
  ASSERT_NE(late, nullptr);
  absl::StatusOr<std::string> m = late->Recv(0, 3, absl::Now() + absl::Seconds(10));
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, "hello");
  // A rank that never joins: the send gives up at its deadline, naming the peer and the group.
  std::unique_ptr<GrpcTransport> alone = [&] {
    GrpcTransportOptions o;
    o.group = "never";
    o.addresses = {c_.address(0), c_.address(1)};
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t = GrpcTransport::Create(c_.service(0), o);
    return t.ok() ? std::move(*t) : nullptr;
  }();
  ASSERT_NE(alone, nullptr);
  const absl::Time t0 = absl::Now();
  absl::Status s = alone->Send(1, 3, "x", t0 + absl::Milliseconds(500));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no rank 1 of collective group 'never'")) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST_F(HostileChunkTest, ASecondRegistrationOfARankIsRefused) {
  auto box = std::make_shared<Mailbox>(1, 2);
  EXPECT_EQ(c_.service(1)->Register("test-group", box).code(), absl::StatusCode::kAlreadyExists);
  GrpcTransportOptions o;
  o.group = "test-group";
  o.rank = 3;
  o.addresses = {"a", "b"};
  EXPECT_FALSE(GrpcTransport::Create(c_.service(1), o).ok());
}

}  // namespace
}  // namespace longhaul::collective
