#include "bench/torch_trace.h"

#include <memory>
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "common/torch_status.h"

namespace longhaul::bench {

absl::Status TraceTo(const std::string& path, const torch::Device& d, const std::function<absl::Status()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (d.is_cuda()) activities.insert(ActivityType::CUDA);
  absl::Status started = CatchTorch("start the profiler", [&]() -> absl::Status {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    return absl::OkStatus();
  });
  if (!started.ok()) return started;
  absl::Status ran = work();
  absl::Status saved = CatchTorch("write the trace", [&]() -> absl::Status {
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    if (ran.ok()) result->save(path);
    return absl::OkStatus();
  });
  return ran.ok() ? saved : ran;
}

}  // namespace longhaul::bench
