#include "codec/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace longhaul::codec {
namespace {

TEST(Crc32c, KnownVector) {
  // RFC 3720 check value.
  EXPECT_EQ(Crc32cReference("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32c, FastPathMatchesReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(5);
  std::string buf(1100, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n = 0; n + off <= buf.size(); n += 37) {
      ASSERT_EQ(Crc32c(buf.data() + off, n), Crc32cReference(buf.data() + off, n)) << off << " " << n;
    }
  }
}

TEST(Crc32c, ExtendEqualsOneShot) {
  const std::string s = "the quick brown fox jumps over the lazy dog";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32cExtend(Crc32c(s.data(), cut), s.data() + cut, s.size() - cut),
              Crc32c(s.data(), s.size()));
  }
}

}  // namespace
}  // namespace longhaul::codec
