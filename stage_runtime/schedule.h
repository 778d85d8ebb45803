// Pipeline schedules: per stage, the order of its forward (F) and backward (B) micro-batch
// operations within one step.
//   GPipe: F0 F1 ... F(M-1) B0 ... B(M-1)        (stores up to M activations)
//          except the last stage (S > 1), which needs no gradient from anyone: F0 B0 F1 B1 ...
//          (stores one), holding its gradients B0 .. B(M-2) until its input F(M-1) has arrived.
//          The arithmetic is GPipe's (every stage runs each pass in the same micro-batch order);
//          only the last stage's own forward and backward leave the turn between the passes.
//          The gradients wait because stage S - 2's download still carries forward frames until
//          then (tools/pipeline-fluid-model.py: sent at once they share it and slow both).
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
  bool hold_output = false;   // a backward's gradient: kept until an op with release_held
  bool release_held = false;  // a forward's: once its input has arrived, the held gradients go
};
std::vector<PipelineOp> StageSchedule(Schedule s, int stage, int stages, int micro_batches);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_SCHEDULE_H_
