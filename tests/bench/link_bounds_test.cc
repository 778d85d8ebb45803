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

}  // namespace
}  // namespace longhaul::bench
