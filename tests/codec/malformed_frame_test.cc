// Hostile and corrupt frames: each must be a clear error (the message names the problem), never a
// crash, an over-read or a huge allocation. Frames are re-sealed with a valid CRC so each case
// reaches the check it targets.
#include <gtest/gtest.h>

#include <cstring>

#include "codec/byte_io.h"
#include "codec/codec.h"
#include "codec/frame.h"

namespace longhaul::codec {
namespace {

std::string Encode(const std::string& spec, const torch::Tensor& x) {
  auto c = MakeCodec(spec);
  EXPECT_TRUE(c.ok());
  auto f = (*c)->Encode(x);
  EXPECT_TRUE(f.ok());
  return *f;
}

// Parses a valid frame, lets the test change header and payload, and seals it again.
template <typename Fn>
std::string Reseal(const std::string& frame, Fn&& mutate) {
  auto v = ParseFrame(frame, {});
  EXPECT_TRUE(v.ok()) << v.status();
  FrameHeader h = v->header;
  std::string payload(v->payload);
  mutate(h, payload);
  return BuildFrame(h, payload);
}

void ExpectError(const std::string& frame, const std::string& words, DecodeOptions o = {}) {
  auto r = DecodeFrame(frame, o);
  ASSERT_FALSE(r.ok()) << "accepted a bad frame; expected: " << words;
  EXPECT_NE(r.status().message().find(words), std::string::npos)
      << "message \"" << r.status().message() << "\" does not mention \"" << words << "\"";
}

const torch::Tensor kX = torch::randn({6, 128}) * torch::arange(1, 129).to(torch::kFloat32);

TEST(MalformedFrame, Truncated) {
  for (const char* spec : {"fp32", "int4", "tahquant"}) {
    const std::string f = Encode(spec, kX);
    ExpectError(f.substr(0, f.size() - 1), "truncated");
    ExpectError(f.substr(0, 10), "truncated");
  }
}

TEST(MalformedFrame, TrailingBytes) { ExpectError(Encode("int4", kX) + "x", "trailing"); }

TEST(MalformedFrame, WrongCrc) {
  std::string f = Encode("tahquant", kX);
  f[f.size() / 2] ^= 0x40;
  ExpectError(f, "CRC32C mismatch");
}

TEST(MalformedFrame, BadMagicAndVersions) {
  std::string f = Encode("fp32", kX);
  std::string g = f;
  g[0] = 'X';
  ExpectError(g, "bad magic");
  g = f;
  g[4] = 9;
  ExpectError(g, "format version");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.codec_version = 7; }), "version 7");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.codec = static_cast<CodecId>(99); }),
              "unknown codec id 99");
}

TEST(MalformedFrame, ShapeProductOverflows) {
  const std::string f = Encode("fp32", kX);
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.shape = {int64_t{1} << 40, int64_t{1} << 40}; }),
              "limit");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.shape = {-1}; }), "limit");
}

TEST(MalformedFrame, ShapeAboveConfigurableLimit) {
  const std::string f = Encode("int8", kX);  // 768 elements
  DecodeOptions o;
  o.limits.max_elements = 700;
  ExpectError(f, "limit", o);
  o.limits.max_elements = 768;
  EXPECT_TRUE(DecodeFrame(f, o).ok());
}

TEST(MalformedFrame, HugeShapeWithTinyPayloadAllocatesNothing) {
  // 2^28 elements claimed (1 GiB of fp32) with a payload of a few hundred bytes: rejected by the
  // payload-size check before any allocation.
  const std::string f = Encode("tahquant", kX);
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.shape = {int64_t{1} << 22, 64}; }),
              "too short");
  const std::string r = Encode("fp32", kX);
  ExpectError(Reseal(r, [](FrameHeader& h, std::string&) { h.shape = {int64_t{1} << 28}; }),
              "shape needs");
}

TEST(MalformedFrame, TooManyDimensions) {
  std::string f = Encode("fp32", torch::randn({2}));
  f[8] = 9;
  ExpectError(f, "dimensions");
}

TEST(MalformedFrame, BitWidthsOutOfRange) {
  const std::string f = Encode("tahquant", kX);
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.params[2] = 9; }), "bit widths");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.params[3] = 1; }), "bit widths");
  // A token claiming a width the header does not allow.
  ExpectError(Reseal(f, [](FrameHeader&, std::string& p) { p[0] = 5; }), "bit width 5");
}

TEST(MalformedFrame, BadGroupSizeAndParams) {
  const std::string f = Encode("int4", kX);
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { SetU16(h.params.data(), 48); }), "group size");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { SetF32(h.params.data() + 12, NAN); }), "tau");
  ExpectError(Reseal(f, [](FrameHeader& h, std::string&) { h.params[7] = 1; }), "reserved");
  ExpectError(Reseal(Encode("fp16", kX), [](FrameHeader& h, std::string&) { h.params[0] = 1; }),
              "non-zero parameters");
}

TEST(MalformedFrame, NonFiniteScale) {
  // The token exponent scales every group; out of range it would decode to Inf.
  const std::string f = Encode("tahquant", kX);
  ExpectError(Reseal(f, [](FrameHeader&, std::string& p) { p[1] = 127; }), "corrupt scale");
  ExpectError(Reseal(f, [](FrameHeader&, std::string& p) { p[1] = static_cast<char>(-128); }),
              "corrupt scale");
}

// Finds the first token block's first transformed group (flag bit) in a tahquant payload.
TEST(MalformedFrame, PivotOutOfRangeAndBadFlags) {
  torch::Tensor x = torch::randn({1, 128});
  x[0][5] = 100.0f;  // outlier in group 0 -> transformed, pivot 5
  const std::string f = Encode("tahquant:g=64", x);
  auto v = ParseFrame(f, {});
  ASSERT_TRUE(v.ok());
  const size_t params = 2, pivots = 2 + 3 * 2;
  ASSERT_TRUE(static_cast<uint8_t>(v->payload[params + 2]) & 0x80) << "group 0 not transformed";
  ASSERT_EQ(v->payload[pivots], 5);
  ExpectError(Reseal(f, [&](FrameHeader&, std::string& p) { p[pivots] = 64; }), "pivot index 64");
  ExpectError(Reseal(f, [&](FrameHeader& h, std::string&) { h.params[4] &= ~2; }),
              "disables Hadamard");
  // Transformed flag on a partial group: dim 100 has a 36-wide last group.
  torch::Tensor y = torch::randn({1, 100});
  const std::string g = Encode("tahquant:g=64,tau=1000", y);
  ExpectError(Reseal(g, [&](FrameHeader&, std::string& p) { p[2 + 3 + 2] |= 0x80; }), "partial");
}

TEST(MalformedFrame, RawPayloadSizeMismatch) {
  const std::string f = Encode("bf16", kX);
  ExpectError(Reseal(f, [](FrameHeader&, std::string& p) { p.pop_back(); }), "shape needs");
}

TEST(MalformedFrame, RandomCorruptionNeverCrashes) {
  // Deterministic sweep of byte corruptions with the CRC fixed up: every result is either a valid
  // tensor of the declared shape or an error.
  const std::string f = Encode("tahquant", kX);
  auto v = ParseFrame(f, {});
  ASSERT_TRUE(v.ok());
  const std::string payload(v->payload);
  uint64_t s = 12345;
  for (int i = 0; i < 3000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::string p = payload;
    p[(s >> 20) % p.size()] = static_cast<char>(s >> 56);
    if (i % 3 == 0) p.resize((s >> 8) % (p.size() + 1));
    auto r = DecodeFrame(BuildFrame(v->header, p));
    if (r.ok()) {
      EXPECT_EQ(r->sizes(), kX.sizes());
    }
  }
}

}  // namespace
}  // namespace longhaul::codec
