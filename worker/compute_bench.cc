#include "worker/compute_bench.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::worker {

absl::StatusOr<double> MeasureComputeGflops(const torch::Device& device, absl::Duration duration) {
  try {
    torch::NoGradGuard no_grad;
    const int64_t n = device.is_cuda() ? 4096 : 512;
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const torch::Tensor a = torch::randn({n, n}, opts);
    const torch::Tensor b = torch::randn({n, n}, opts);
    torch::Tensor c = torch::matmul(a, b);  // warm-up: kernels loaded, buffers allocated
    auto sync = [&] {
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
    };
    sync();
    const absl::Time t0 = absl::Now();
    int64_t products = 0;
    absl::Duration elapsed;
    do {
      c = torch::matmul(a, b);
      ++products;
      sync();
      elapsed = absl::Now() - t0;
    } while (elapsed < duration);
    const double flops = 2.0 * static_cast<double>(n) * n * n * static_cast<double>(products);
    return flops / absl::ToDoubleSeconds(elapsed) / 1e9;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("compute benchmark on ", device.str(), ": ", e.what_without_backtrace()));
  }
}

}  // namespace longhaul::worker
