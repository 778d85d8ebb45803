#include "codec/frame.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace longhaul::codec
