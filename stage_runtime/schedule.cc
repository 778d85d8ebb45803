#include "stage_runtime/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::k1F1B;
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule \"", name, "\" (gpipe or 1f1b)"));
}

std::vector<PipelineOp> StageSchedule(Schedule s, int stage, int stages, int m) {
  std::vector<PipelineOp> ops;
  if (s == Schedule::kGPipe) {
    for (int i = 0; i < m; ++i) ops.push_back({true, i});
    for (int i = 0; i < m; ++i) ops.push_back({false, i});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    ops.push_back({true, warmup + i});
    ops.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) ops.push_back({false, i});
  return ops;
}

}  // namespace longhaul::stage_runtime
