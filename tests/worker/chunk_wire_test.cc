// The copy-free chunk wire form against protobuf's own encoder and parser (what we send must be a
// valid TensorFrameChunk, and what we parse must agree with protobuf on any valid encoding), the
// acks, the MessageKind <-> Direction mapping, and turning a reassembled frame into a LinkMessage.
#include "worker/chunk_wire.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/codec.h"
#include "worker/link_receiver.h"
#include "worker/link_wire.h"

namespace longhaul::worker {
namespace {

v1::TensorFrameChunk Header() {
  v1::TensorFrameChunk h;
  h.set_job_id(7);
  h.set_step(123456789012ULL);
  h.set_micro_batch(3);
  h.set_direction(v1::DIRECTION_BACKWARD);
  h.set_chunk_index(2);
  h.set_chunk_count(5);
  h.set_frame_bytes(1 << 20);
  h.set_from_stage(-1);  // negative int32: a 10-byte varint
  h.set_from_replica(3);
  return h;
}

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> s;
  EXPECT_TRUE(bb.Dump(&s).ok());
  std::string out;
  for (const grpc::Slice& x : s) out.append(reinterpret_cast<const char*>(x.begin()), x.size());
  return out;
}

// The same bytes, one slice per byte: every field straddles a slice boundary somewhere.
grpc::ByteBuffer Bytewise(const std::string& bytes) {
  std::vector<grpc::Slice> s;
  for (char c : bytes) s.emplace_back(&c, 1);
  return grpc::ByteBuffer(s.data(), s.size());
}

grpc::ByteBuffer Whole(const std::string& bytes) {
  grpc::Slice s(bytes);
  return grpc::ByteBuffer(&s, 1);
}

std::string DataOf(const ParsedChunk& c) {
  std::string d;
  AppendChunkData(c, &d);
  return d;
}

TEST(ChunkWire, MethodNameMatchesTheGeneratedService) {
  EXPECT_STREQ(StageLinkStreamMethod(), "/longhaul.v1.StageLink/Stream");
}

TEST(ChunkWire, SerializedChunkIsAValidProtobufMessage) {
  // A frame in two pieces (head string + tensor memory); chunks that cover the head only, the
  // boundary, and the body only.
  auto codec = codec::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  torch::Tensor t = torch::arange(1000, torch::kFloat32);
  absl::StatusOr<codec::FrameParts> parts = (*codec)->EncodeParts(t);
  ASSERT_TRUE(parts.ok());
  ASSERT_TRUE(parts->body.defined());
  ASSERT_EQ(parts->body.data_ptr(), t.data_ptr()) << "fp32 payload must not be copied";
  const std::string whole = parts->Join();
  ASSERT_EQ(whole, *(*codec)->Encode(t));
  auto frame = std::make_shared<const codec::FrameParts>(std::move(*parts));
  const size_t head = frame->head.size();
  for (auto [off, len] : {std::pair<size_t, size_t>{0, 10}, {head - 5, 40}, {head + 100, 900}, {0, whole.size()}, {3, 0}}) {
    grpc::ByteBuffer bb = SerializeChunk(Header(), frame, off, len);
    v1::TensorFrameChunk pb;
    ASSERT_TRUE(pb.ParseFromString(Flatten(bb))) << off;
    v1::TensorFrameChunk want = Header();
    want.set_data(whole.substr(off, len));
    EXPECT_EQ(pb.SerializeAsString(), want.SerializeAsString()) << off << "+" << len;

    absl::StatusOr<ParsedChunk> c = ParseChunk(bb);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->header.SerializeAsString(), Header().SerializeAsString());
    EXPECT_EQ(DataOf(*c), whole.substr(off, len));
  }
}

TEST(ChunkWire, ParsesProtobufEncodingsAcrossSliceBoundaries) {
  v1::TensorFrameChunk m = Header();
  m.set_data(std::string(3000, 'x') + "tail");
  const std::string bytes = m.SerializeAsString();
  for (const grpc::ByteBuffer& bb : {Whole(bytes), Bytewise(bytes)}) {
    absl::StatusOr<ParsedChunk> c = ParseChunk(bb);
    ASSERT_TRUE(c.ok()) << c.status();
    v1::TensorFrameChunk h = m;
    h.clear_data();
    EXPECT_EQ(c->header.SerializeAsString(), h.SerializeAsString());
    EXPECT_EQ(DataOf(*c), m.data());
  }
}

TEST(ChunkWire, FieldOrderRepeatsAndUnknownFieldsAsProtobufDoes) {
  // data first, then header fields, then an unknown field of every wire type, then data again and
  // step again: protobuf keeps the last value of a singular field and skips unknown ones.
  v1::TensorFrameChunk first_data;
  first_data.set_data("first");
  v1::TensorFrameChunk rest = Header();
  std::string unknown;
  unknown += '\xa0';  unknown += '\x06';  unknown += '\x01';          // field 100 varint (2-byte tag)
  unknown += '\x59';  unknown += std::string(8, '\x01');               // field 11 fixed64
  unknown += '\x65';  unknown += std::string(4, '\x02');               // field 12 fixed32
  unknown += '\x6a';  unknown += '\x03';  unknown += "abc";            // field 13 bytes
  unknown += '\x08';  unknown += '\x00';  unknown[unknown.size() - 2] = '\x40';  // field 8 as varint: unknown
  v1::TensorFrameChunk last;
  last.set_data("second");
  last.set_step(99);
  const std::string bytes = first_data.SerializeAsString() + rest.SerializeAsString() + unknown +
                            last.SerializeAsString();
  v1::TensorFrameChunk pb;
  ASSERT_TRUE(pb.ParseFromString(bytes));
  for (const grpc::ByteBuffer& bb : {Whole(bytes), Bytewise(bytes)}) {
    absl::StatusOr<ParsedChunk> c = ParseChunk(bb);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(DataOf(*c), pb.data());
    EXPECT_EQ(c->header.step(), pb.step());
    EXPECT_EQ(c->header.from_stage(), pb.from_stage());
    EXPECT_EQ(c->header.chunk_count(), pb.chunk_count());
  }
}

TEST(ChunkWire, MalformedMessagesAreRejectedWithAReason) {
  v1::TensorFrameChunk m = Header();
  m.set_data("payload");
  const std::string good = m.SerializeAsString();
  struct Case {
    std::string bytes;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 3), "truncated"},                    // data shorter than its length
      {std::string("\x10\xff\xff", 3), "truncated inside a varint"},     // step varint cut off
      {std::string("\x10") + std::string(11, '\xff'), "longer than 10 bytes"},
      {std::string("\x42\xff\xff\xff\xff\x0f", 6), "truncated"},         // 4 GiB data field, no bytes
      {std::string("\x0b", 1), "wire type 3"},                           // start group
      {std::string("\x00\x01", 2), "field number 0"},
  };
  for (const Case& k : cases) {
    for (const grpc::ByteBuffer& bb : {Whole(k.bytes), Bytewise(k.bytes)}) {
      absl::StatusOr<ParsedChunk> c = ParseChunk(bb);
      ASSERT_FALSE(c.ok()) << k.reason;
      EXPECT_NE(c.status().message().find(k.reason), std::string::npos) << c.status();
    }
  }
}

// Differential check against protobuf on mutated messages: whatever ParseChunk accepts, protobuf
// must accept too, with the same fields and data (and nothing may crash or read out of bounds).
TEST(ChunkWire, AgreesWithProtobufOnMutatedMessages) {
  std::mt19937 rng(7);
  v1::TensorFrameChunk m = Header();
  m.set_data(std::string(300, 'd'));
  const std::string base = m.SerializeAsString();
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (b.size() + 1);
      switch (rng() % 3) {
        case 0: if (at < b.size()) b[at] = static_cast<char>(rng()); break;   // overwrite a byte
        case 1: b.resize(at); break;                                           // truncate
        default: b.insert(at, 1, static_cast<char>(rng())); break;           // insert a byte
      }
    }
    absl::StatusOr<ParsedChunk> c = ParseChunk(trial % 2 ? Bytewise(b) : Whole(b));
    if (!c.ok()) continue;
    ++accepted;
    v1::TensorFrameChunk pb;
    ASSERT_TRUE(pb.ParseFromString(b)) << "accepted what protobuf rejects, trial " << trial;
    EXPECT_EQ(DataOf(*c), pb.data()) << trial;
    pb.clear_data();
    pb.DiscardUnknownFields();  // protobuf keeps unknown fields; the chunk parser skips them
    EXPECT_EQ(c->header.SerializeAsString(), pb.SerializeAsString()) << trial;
  }
  EXPECT_GT(accepted, 1000);  // the mutations must also produce valid messages to compare
}

TEST(ChunkWire, AcksRoundTripAsProtobuf) {
  v1::FrameAck ack;
  ack.set_step(9);
  ack.set_micro_batch(2);
  ack.set_direction(v1::DIRECTION_BACKWARD);
  ack.set_error("frame has 3 bytes, header said 4");
  grpc::ByteBuffer bb = SerializeAck(ack);
  v1::FrameAck pb;
  ASSERT_TRUE(pb.ParseFromString(Flatten(bb)));
  EXPECT_EQ(pb.SerializeAsString(), ack.SerializeAsString());
  for (grpc::ByteBuffer b : {SerializeAck(ack), Bytewise(ack.SerializeAsString())}) {
    absl::StatusOr<v1::FrameAck> got = ParseAck(&b);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), ack.SerializeAsString());
  }
  grpc::ByteBuffer empty = SerializeAck(v1::FrameAck());
  absl::StatusOr<v1::FrameAck> none = ParseAck(&empty);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->error().empty());
  grpc::ByteBuffer garbage = Whole(std::string("\x22\x05" "ab", 4));  // error field cut short
  absl::StatusOr<v1::FrameAck> bad = ParseAck(&garbage);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unreadable FrameAck"), std::string::npos) << bad.status();
}

TEST(LinkWire, EveryMessageKindHasItsDirection) {
  using stage_runtime::MessageKind;
  for (MessageKind k : {MessageKind::kActivation, MessageKind::kGradient, MessageKind::kNormPartial,
                        MessageKind::kNormTotal}) {
    absl::StatusOr<MessageKind> back = ToMessageKind(ToDirection(k));
    ASSERT_TRUE(back.ok()) << stage_runtime::MessageKindName(k);
    EXPECT_EQ(*back, k);
  }
  EXPECT_EQ(ToDirection(MessageKind::kActivation), v1::DIRECTION_FORWARD);
  EXPECT_EQ(ToDirection(MessageKind::kGradient), v1::DIRECTION_BACKWARD);
  EXPECT_FALSE(ToMessageKind(v1::DIRECTION_UNSPECIFIED).ok());
  EXPECT_FALSE(ToMessageKind(static_cast<v1::Direction>(42)).ok());
}

TEST(DecodeInFrame, TensorAndNormFramesBecomeLinkMessages) {
  v1::TensorFrameChunk first;
  first.set_step(4);
  first.set_micro_batch(2);
  first.set_direction(v1::DIRECTION_BACKWARD);
  auto codec = codec::MakeCodec("fp32");
  const torch::Tensor x = torch::randn({3, 5});
  absl::StatusOr<stage_runtime::LinkMessage> g =
      DecodeInFrame(first, std::make_shared<std::string>(*(*codec)->Encode(x)));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->kind, stage_runtime::MessageKind::kGradient);
  EXPECT_EQ(g->step, 4u);
  EXPECT_EQ(g->micro_batch, 2);
  EXPECT_TRUE(torch::equal(g->tensor, x));

  first.set_direction(v1::DIRECTION_NORM_PARTIAL);
  const double v = 12.5;
  auto bytes = std::make_shared<std::string>(sizeof(v), '\0');
  std::memcpy(bytes->data(), &v, sizeof(v));
  absl::StatusOr<stage_runtime::LinkMessage> n = DecodeInFrame(first, bytes);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->kind, stage_runtime::MessageKind::kNormPartial);
  EXPECT_EQ(n->value, v);
  EXPECT_FALSE(n->tensor.defined());

  const double negative = -1;
  std::memcpy(bytes->data(), &negative, sizeof(negative));
  absl::StatusOr<stage_runtime::LinkMessage> bad = DecodeInFrame(first, bytes);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("norm frame carries -1"), std::string::npos) << bad.status();
  first.set_direction(v1::DIRECTION_UNSPECIFIED);
  EXPECT_FALSE(DecodeInFrame(first, bytes).ok());
}

TEST(SharedFrameDecode, Fp32AliasesTheFrameOthersCopy) {
  torch::Tensor x = torch::randn({4, 33});
  for (const char* spec : {"fp32", "fp16", "int8"}) {
    auto codec = codec::MakeCodec(spec);
    ASSERT_TRUE(codec.ok());
    absl::StatusOr<codec::FrameParts> parts = (*codec)->EncodeParts(x);
    ASSERT_TRUE(parts.ok());
    ASSERT_EQ(parts->Join(), *(*codec)->Encode(x)) << spec;
    auto frame = std::make_shared<std::string>(parts->Join());
    const char* begin = frame->data();
    const char* end = begin + frame->size();
    absl::StatusOr<torch::Tensor> want = codec::DecodeFrame(*frame);
    absl::StatusOr<torch::Tensor> got = codec::DecodeSharedFrame(frame);
    ASSERT_TRUE(want.ok() && got.ok()) << spec;
    EXPECT_TRUE(torch::equal(*want, *got)) << spec;
    const char* p = static_cast<const char*>(got->data_ptr());
    EXPECT_EQ(p >= begin && p < end, std::string(spec) == "fp32") << spec;
  }
  // The tensor keeps the frame alive after the caller lets go of it.
  auto codec = codec::MakeCodec("fp32");
  auto frame = std::make_shared<std::string>(*(*codec)->Encode(x));
  torch::Tensor y = *codec::DecodeSharedFrame(std::move(frame));
  EXPECT_TRUE(torch::equal(x, y));
}

TEST(SharedFrameDecode, CorruptFrameStillFailsTheChecksum) {
  auto codec = codec::MakeCodec("fp32");
  auto frame = std::make_shared<std::string>(*(*codec)->Encode(torch::ones({64})));
  (*frame)[frame->size() - 1] ^= 1;
  absl::StatusOr<torch::Tensor> t = codec::DecodeSharedFrame(frame);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("CRC32C"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace longhaul::worker
