#include "codec/crc32c.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

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

// Every implementation, the copying variants included, against the byte-at-a-time reference: all
// lengths up to 1200 (the folding path starts at 512 and handles 16-byte and shorter tails) at
// every alignment mod 8, then long buffers around the 256-byte main loop, from non-zero CRCs.
TEST(Crc32c, EveryPathAndCopyMatchReference) {
  std::mt19937 rng(23);
  std::string buf(70000, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1200; ++n) lengths.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65536 - 17, 65536, 69000}) lengths.push_back(n);
  for (Crc32cPath path : {Crc32cPath::kReference, Crc32cPath::kSse42, Crc32cPath::kVpclmul}) {
    if (!Crc32cPathAvailable(path)) {
      std::printf("path %d not available on this CPU (its fallback is tested instead)\n", static_cast<int>(path));
    }
    for (size_t off = 0; off < 8; ++off) {
      for (size_t n : lengths) {
        if (off + n > buf.size()) continue;
        const uint32_t start = static_cast<uint32_t>(n * 2654435761u);
        const uint32_t want = Crc32cReferenceExtend(start, buf.data() + off, n);
        ASSERT_EQ(Crc32cExtendWith(path, start, buf.data() + off, n), want) << static_cast<int>(path) << " " << off << " " << n;
        std::string dst(n + 2, 'x');
        ASSERT_EQ(Crc32cCopyExtendWith(path, start, dst.data() + 1, buf.data() + off, n), want)
            << static_cast<int>(path) << " " << off << " " << n;
        ASSERT_EQ(dst.substr(1, n), buf.substr(off, n));
        ASSERT_EQ(dst.front(), 'x');  // nothing written outside [dst, dst + n)
        ASSERT_EQ(dst.back(), 'x');
      }
    }
  }
  std::string dst(buf.size(), '\0');
  EXPECT_EQ(Crc32cCopyExtend(7, dst.data(), buf.data(), buf.size()), Crc32cReferenceExtend(7, buf.data(), buf.size()));
  EXPECT_EQ(dst, buf);
}

}  // namespace
}  // namespace longhaul::codec
