#include "stage_runtime/partition.h"

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::StatusOr<std::vector<LayerRange>> PartitionLayers(int layers, int stages) {
  if (stages < 1 || stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", layers, " layers into ", stages, " stages (need 1 <= stages <= layers)"));
  }
  std::vector<LayerRange> r;
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int n = layers / stages + (s < layers % stages ? 1 : 0);
    r.push_back({begin, begin + n});
    begin += n;
  }
  return r;
}

}  // namespace longhaul::stage_runtime
