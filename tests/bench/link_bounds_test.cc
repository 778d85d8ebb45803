// The sweep's link bounds (bench/link_bounds.h), against figures worked out by hand.
#include "bench/link_bounds.h"

#include <gtest/gtest.h>

namespace longhaul::bench {
namespace {

// docs/gpu-sweep.md's 100 Mbit/s fp32 cell: 32 micro-batches of [1, 1024, 1600] fp32 (6,553,600
// bytes each way, headers left out here) through 4 stages, TCP's goodput 95.67 Mbit/s.
TEST(LinkBoundsTest, GpipeAddsItsFillAndDrainToTheBusiestLinksFrames) {
  const LinkBounds b = ComputeLinkBounds({32.0 * 1024, 6553600, 6553600, 32, 4, true, true, 100, 95.67});
  EXPECT_DOUBLE_EQ(b.busiest_bytes, 32.0 * 2 * 6553600);
  EXPECT_NEAR(b.at_rate, 976.56, 0.01);  // 32,768 tokens / (419.4 MB at 12.5 MB/s)
  EXPECT_NEAR(b.at_goodput, 976.56 * 0.9567, 0.01);
  EXPECT_NEAR(b.gpipe_at_rate, 976.56 * 32 / 34, 0.01);  // (M + S - 2) frame pairs: 34
  EXPECT_NEAR(b.gpipe_at_goodput, 976.56 * 32 / 34 * 0.9567, 0.01);
}

TEST(LinkBoundsTest, OneFOneBInProcessIsBoundByTheLargerDirectionAndHasNoGpipeBound) {
  const LinkBounds b = ComputeLinkBounds({100, 3000, 1000, 10, 4, false, false, 8, 8});
  EXPECT_DOUBLE_EQ(b.busiest_bytes, 10 * 3000.0);
  EXPECT_DOUBLE_EQ(b.at_rate, 100 / (30000.0 / 1e6));
  EXPECT_DOUBLE_EQ(b.at_goodput, b.at_rate);
  EXPECT_EQ(b.gpipe_at_rate, 0);
  EXPECT_EQ(b.gpipe_at_goodput, 0);
}

TEST(LinkBoundsTest, FillAndDrainNeedTwoStagesOrMore) {
  EXPECT_EQ(GPipeLinkSteps(8, 1), 8);
  EXPECT_EQ(GPipeLinkSteps(8, 2), 8);
  EXPECT_EQ(GPipeLinkSteps(8, 4), 10);
  EXPECT_EQ(GPipeLinkSteps(32, 4), 34);
}

// SDP4Bit's sync at 100 Mbit/s (12.5 MB/s) in session 22's sweep, roughly: 10 ms unshaped, 7 ms of
// it before the update and 2 ms after; 56 KB across before the update and 56 KB after.
TEST(LinkBoundsTest, ASyncsChainSendsItsPartsOneAfterTheOther) {
  SyncFigures f;
  f.sync = 0.010;
  f.before_update = 0.007;
  f.after_update = 0.002;
  f.link_bytes = 112000;
  f.link_bytes_before_update = 56000;
  f.link_bytes_after_update = 56000;
  EXPECT_DOUBLE_EQ(SyncBound(f, 12.5e6), 0.010);                      // unshaped: 8.96 ms of link overlaps
  EXPECT_DOUBLE_EQ(SyncChainBound(f, 12.5e6), 0.007 + 56000 / 12.5e6);  // 7 ms, then 4.48 ms of link
  // Link-bound parts: the chain is their link times summed, which the whole's bound is too.
  EXPECT_DOUBLE_EQ(SyncChainBound(f, 1.25e6), 112000 / 1.25e6);
  EXPECT_DOUBLE_EQ(SyncBound(f, 1.25e6), 112000 / 1.25e6);
  // Without an update there is no chain.
  f.before_update = -1;
  EXPECT_EQ(SyncChainBound(f, 12.5e6), 0);
}

}  // namespace
}  // namespace longhaul::bench
