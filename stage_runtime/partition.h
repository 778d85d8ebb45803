// Pipeline partitioning: which transformer blocks each stage holds. Plain C++ (Abseil only), so
// the coordinator places jobs without linking LibTorch.
//
//   absl::StatusOr<std::vector<LayerRange>> parts = PartitionLayers(/*layers=*/10, /*stages=*/4);
//   // {[0,3), [3,6), [6,8), [8,10)}: earlier stages take the remainder
#ifndef LONGHAUL_STAGE_RUNTIME_PARTITION_H_
#define LONGHAUL_STAGE_RUNTIME_PARTITION_H_

#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

struct LayerRange {
  int begin = 0;  // first block index
  int end = 0;    // one past the last
};

// Splits `layers` blocks into `stages` contiguous ranges as evenly as possible (earlier stages get
// the remainder). Error if stages < 1 or stages > layers.
absl::StatusOr<std::vector<LayerRange>> PartitionLayers(int layers, int stages);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_PARTITION_H_
