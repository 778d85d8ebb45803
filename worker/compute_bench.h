// The worker's compute speed for the placement's cost model (coordinator/placement.h): fp32
// matrix products on its device, timed at start-up and reported at registration
// (WorkerInfo.compute_gflops).
//
//   absl::StatusOr<double> gflops = MeasureComputeGflops(torch::kCPU);   // ~0.3 s
//
// Square products of 512 (CPU) or 4096 (CUDA) elements a side, repeated for about `duration`
// after one warm-up product; on CUDA the device is synchronised before each clock reading. It
// measures what the device does with LibTorch's current thread settings (--threads).
#ifndef LONGHAUL_WORKER_COMPUTE_BENCH_H_
#define LONGHAUL_WORKER_COMPUTE_BENCH_H_

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace longhaul::worker {

absl::StatusOr<double> MeasureComputeGflops(const torch::Device& device,
                                            absl::Duration duration = absl::Milliseconds(300));

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_COMPUTE_BENCH_H_
