// Pipeline schedules: per stage, the order of its forward (F) and backward (B) micro-batch
// operations within one step.
//   GPipe: F0 F1 ... F(M-1) B0 ... B(M-1)        (stores up to M activations); the step loop
//          runs the last stage of several by its inputs' arrival instead, both passes still in
//          this order (StageLoop: a backward while no activation waits, gradients held until the
//          last activation has arrived)
//   1F1B:  min(S-s-1, M) warm-up forwards, then alternate F/B, then the remaining backwards
//          (PipeDream-flush; stage s stores at most S-s activations).
#ifndef LONGHAUL_STAGE_RUNTIME_SCHEDULE_H_
#define LONGHAUL_STAGE_RUNTIME_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

enum class Schedule { kGPipe, k1F1B };
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);  // "gpipe" | "1f1b"

struct PipelineOp {
  bool forward;
  int micro_batch;
};
std::vector<PipelineOp> StageSchedule(Schedule s, int stage, int stages, int micro_batches);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_SCHEDULE_H_
