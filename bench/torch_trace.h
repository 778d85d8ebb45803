// --trace of the benchmarks on LibTorch (stage, and codec on a device): work run under LibTorch's
// Kineto profiler, written as a Chrome trace (tools/torch-trace-summary.py reads it).
#ifndef LONGHAUL_BENCH_TORCH_TRACE_H_
#define LONGHAUL_BENCH_TORCH_TRACE_H_

#include <functional>
#include <string>

#include <torch/torch.h>

#include "absl/status/status.h"

namespace longhaul::bench {

// Runs `work` under LibTorch's (Kineto) profiler, the host's operators and, when `d` is a CUDA
// device, every kernel of the process on the GPU (the codecs' own kernels included), and writes the
// Chrome trace to `path` when the work succeeded. Fails, saying so, where LibTorch has no Kineto
// (Debian's) or no trace was written to `path` (checked by its size afterwards: Kineto only logs a
// file it cannot open); the work's failure comes first.
absl::Status TraceTo(const std::string& path, const torch::Device& d, const std::function<absl::Status()>& work);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_TORCH_TRACE_H_
