#include "bench/torch_trace.h"

#include <filesystem>
#include <memory>
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "absl/strings/str_cat.h"
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
  // Any earlier file of that name goes first: Kineto logs a file it cannot open, and returns.
  std::error_code ec;
  std::filesystem::remove(path, ec);
  absl::Status saved = CatchTorch("write the trace", [&]() -> absl::Status {
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    if (ran.ok()) result->save(path);
    return absl::OkStatus();
  });
  if (!ran.ok()) return ran;
  if (!saved.ok()) return saved;
  if (std::filesystem::file_size(path, ec) == 0 || ec) {
    return absl::FailedPreconditionError(absl::StrCat("the profiler wrote no trace to ", path));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::bench
