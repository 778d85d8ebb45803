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

// The fast path interleaves three streams over 3 x 8 KiB and 3 x 256 B blocks and joins them with
// tabulated shift operators: lengths around those block sizes, and a long extend from a non-zero
// CRC, must agree with the byte-at-a-time reference.
TEST(Crc32c, InterleavedBlocksMatchReference) {
  std::mt19937 rng(11);
  std::string buf(3 * 8192 * 5 + 4000, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  for (size_t n : {size_t{767}, size_t{768}, size_t{769}, size_t{3 * 8192 - 1}, size_t{3 * 8192},
                   size_t{3 * 8192 + 768 + 5}, size_t{2 * 3 * 8192 + 1}, buf.size() - 3}) {
    for (size_t off : {size_t{0}, size_t{3}}) {
      ASSERT_EQ(Crc32c(buf.data() + off, n), Crc32cReference(buf.data() + off, n)) << off << " " << n;
    }
  }
  const uint32_t head = Crc32c(buf.data(), 1000);
  EXPECT_EQ(Crc32cExtend(head, buf.data() + 1000, buf.size() - 1000), Crc32cReference(buf.data(), buf.size()));
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
