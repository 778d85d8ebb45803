// Fuzz target: the job-spec parser (coordinator/job_spec.h), which `SubmitJob` runs on whatever a
// client sends (and `longhaulctl plan --simulate` on a local file). Any byte string must give a
// spec or an error with a message, never a crash, a hang or an exception. A spec it accepts must
// pass ValidateJobSpec again (the coordinator re-validates loaded specs), be partitionable into its
// stages (the scheduler does it without checking) and give a finite, non-negative memory estimate
// (the submit-time check). The seed corpus is tests/fuzz/seeds/job_spec, the dictionary
// tests/fuzz/job_spec.dict.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "coordinator/job_spec.h"
#include "stage_runtime/partition.h"

using namespace longhaul;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<v1::JobSpec> spec = coordinator::ParseJobSpec(yaml);
  if (!spec.ok()) {
    if (spec.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (!coordinator::ValidateJobSpec(*spec).ok()) std::abort();
  if (!stage_runtime::PartitionLayers(spec->model().layers(), spec->stages()).ok()) std::abort();
  const coordinator::MemoryEstimate e = coordinator::EstimateStageMemory(*spec);
  if (!std::isfinite(e.total_bytes()) || e.total_bytes() <= 0 || e.stage < 0 || e.stage >= spec->stages()) {
    std::abort();
  }
  (void)e.ToString(spec->stages());
  return 0;
}
