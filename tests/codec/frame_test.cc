#include "codec/frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace longhaul::codec {
namespace {

TEST(Frame, HeaderRoundTrip) {
  FrameHeader h;
  h.codec = CodecId::kTahQuant;
  h.codec_version = 1;
  h.dtype = FrameDtype::kBFloat16;
  h.shape = {2, 3, 4};
  h.params[0] = 64;
  const std::string f = BuildFrame(h, "payload!");
  EXPECT_EQ(f.size(), FrameHeaderBytes(3) + 8);
  auto v = ParseFrame(f, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->header.codec, CodecId::kTahQuant);
  EXPECT_EQ(v->header.dtype, FrameDtype::kBFloat16);
  EXPECT_EQ(v->header.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(v->header.params[0], 64);
  EXPECT_EQ(v->numel, 24);
  EXPECT_EQ(v->payload, "payload!");
}

TEST(Frame, EveryTruncationIsRejected) {
  FrameHeader h;
  h.shape = {5};
  const std::string f = BuildFrame(h, std::string(20, 'x'));
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_FALSE(ParseFrame(absl::string_view(f.data(), n), {}).ok()) << n;
  }
}

TEST(Frame, EverySingleBitFlipIsRejected) {
  FrameHeader h;
  h.shape = {2, 2};
  const std::string f = BuildFrame(h, std::string(16, '\x11'));
  for (size_t byte = 0; byte < f.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string g = f;
      g[byte] ^= static_cast<char>(1 << bit);
      EXPECT_FALSE(ParseFrame(g, {}).ok()) << byte << ":" << bit;
    }
  }
}

// FrameCrc fed in two or three pieces split anywhere (inside the first 9 bytes, inside the header,
// at its end, in the payload) gives the CRC the header stores; ParseFrame accepts the frame with it
// and rejects a wrong one without reading the payload.
TEST(Frame, FrameCrcFromPiecesEqualsStoredCrc) {
  FrameHeader h;
  h.shape = {3, 7, 2};
  std::string payload(3 * 7 * 2 * 4 + 1000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 + 7);
  const std::string f = BuildFrame(h, payload);
  uint32_t stored;
  std::memcpy(&stored, f.data() + FrameHeaderBytes(3) - 4, 4);
  for (size_t a = 0; a <= f.size(); a += (a < 80 ? 1 : 97)) {
    for (size_t b : {a, std::min(f.size(), a + 5), std::min(f.size(), a + 700), f.size()}) {
      FrameCrc c;
      c.Update(f.data(), a);
      c.Update(f.data() + a, b - a);
      c.Update(f.data() + b, f.size() - b);
      ASSERT_TRUE(c.Value().has_value()) << a << " " << b;
      ASSERT_EQ(*c.Value(), stored) << a << " " << b;
    }
  }
  FrameCrc c;
  c.Update(f.data(), f.size());
  EXPECT_TRUE(ParseFrame(f, {}, c.Value()).ok());
  absl::StatusOr<FrameView> wrong = ParseFrame(f, {}, *c.Value() ^ 1);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("CRC32C mismatch"), std::string::npos) << wrong.status();

  FrameCrc tiny;  // shorter than ndim's offset: an 8-byte norm frame travels the same path
  tiny.Update(f.data(), 8);
  EXPECT_FALSE(tiny.Value().has_value());
  FrameCrc partial;
  partial.Update(f.data(), FrameHeaderBytes(3) - 1);
  EXPECT_FALSE(partial.Value().has_value());  // header incomplete
  std::string bad = f;
  bad[8] = static_cast<char>(kMaxFrameDims + 1);
  FrameCrc bad_crc;
  bad_crc.Update(bad.data(), bad.size());
  EXPECT_FALSE(bad_crc.Value().has_value());
  EXPECT_FALSE(ParseFrame(bad, {}, bad_crc.Value()).ok());
}

}  // namespace
}  // namespace longhaul::codec
