// Layer partitioning (stage_runtime/partition.h), as the coordinator's placement uses it: torch-free,
// so it is tested here with the control plane.
#include "stage_runtime/partition.h"

#include <gtest/gtest.h>

namespace longhaul::stage_runtime {
namespace {

TEST(PartitionLayers, EvenSplitWithRemainderFirst) {
  absl::StatusOr<std::vector<LayerRange>> p = PartitionLayers(10, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 4u);
  const int want[4][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ((*p)[s].begin, want[s][0]) << s;
    EXPECT_EQ((*p)[s].end, want[s][1]) << s;
  }
}

TEST(PartitionLayers, OneStageAndOneLayerEach) {
  absl::StatusOr<std::vector<LayerRange>> one = PartitionLayers(5, 1);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].begin, 0);
  EXPECT_EQ((*one)[0].end, 5);
  absl::StatusOr<std::vector<LayerRange>> each = PartitionLayers(3, 3);
  ASSERT_TRUE(each.ok());
  for (int s = 0; s < 3; ++s) EXPECT_EQ((*each)[s].end - (*each)[s].begin, 1);
}

TEST(PartitionLayers, RejectsImpossibleSplits) {
  for (auto [layers, stages] : {std::pair{4, 0}, std::pair{4, 5}, std::pair{0, 1}, std::pair{4, -1}}) {
    absl::StatusOr<std::vector<LayerRange>> p = PartitionLayers(layers, stages);
    ASSERT_FALSE(p.ok()) << layers << "/" << stages;
    EXPECT_NE(p.status().message().find("need 1 <= stages <= layers"), std::string::npos) << p.status();
  }
}

}  // namespace
}  // namespace longhaul::stage_runtime
