#include "worker/device_copy.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#ifdef LONGHAUL_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace longhaul::worker {

namespace {

absl::Status CopyError(const torch::Device& d, const char* what, const c10::Error& e) {
  return absl::InternalError(absl::StrCat(what, " a tensor from ", d.str(), " to the host: ", e.what_without_backtrace()));
}

}  // namespace

#ifdef LONGHAUL_WITH_CUDA

struct DeviceCopier::Streams {
  // One copy stream per device seen; a link's tensors come from one device, so this stays tiny.
  std::vector<std::pair<c10::DeviceIndex, c10::cuda::CUDAStream>> by_device;

  c10::cuda::CUDAStream For(c10::DeviceIndex d) {
    for (const auto& [index, stream] : by_device) {
      if (index == d) return stream;
    }
    // A pool stream (not the default stream, which would serialise with compute's default-stream
    // work); the pool hands the same few streams out round robin, which is fine: streams of
    // different links only need to not be compute's.
    by_device.emplace_back(d, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d));
    return by_device.back().second;
  }

  // Device d's link stream, made to wait (on the GPU) for the work queued so far on the calling
  // thread's current stream there: the compute that wrote the tensors handed over now.
  c10::cuda::CUDAStream After(c10::DeviceIndex d) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(d);
    const c10::cuda::CUDAStream link = For(d);
    at::cuda::CUDAEvent ready;  // destroying it while the wait is pending is fine (CUDA frees it later)
    ready.record(compute);
    ready.block(link);
    return link;
  }
};

absl::StatusOr<torch::Tensor> HostCopy::Wait() {
  if (done_ != nullptr) {
    try {
      static_cast<at::cuda::CUDAEvent*>(done_.get())->synchronize();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("waiting for a copy to the host: ", e.what_without_backtrace()));
    }
    done_.reset();
  }
  return host_;
}

DeviceCopier::DeviceCopier() : streams_(std::make_unique<Streams>()) {}
DeviceCopier::~DeviceCopier() = default;

absl::StatusOr<HostCopy> DeviceCopier::StartHostCopy(const torch::Tensor& src) {
  if (src.device().is_cpu()) return HostCopy(src);
  if (!src.is_cuda()) {  // not a device this build copies asynchronously
    try {
      return HostCopy(src.to(torch::kCPU));
    } catch (const c10::Error& e) {
      return CopyError(src.device(), "copying", e);
    }
  }
  try {
    const c10::DeviceIndex d = src.device().index();
    const c10::cuda::CUDAGuard device(d);
    // Compute wrote `src` on this thread's current stream; the copy stream waits for that work on
    // the GPU, so neither the compute thread nor its stream waits for the copy.
    const c10::cuda::CUDAStream link = streams_->After(d);

    HostCopy c;
    c.host_ = torch::empty(src.sizes(), torch::TensorOptions().dtype(src.scalar_type()).pinned_memory(true));
    {
      const c10::cuda::CUDAStreamGuard on_link(link);
      c.host_.copy_(src, /*non_blocking=*/true);
    }
    // The caller may drop `src` now: the caching allocator does not hand its block out again until
    // the work queued on `link` so far (the copy) is done. Memory not from that allocator is
    // ignored by it; such a tensor's owner keeps it alive.
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), link);
    // Blocking sync: the encoder thread sleeps in Wait instead of spinning a core that the codec
    // and the other stages' threads need.
    auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming | cudaEventBlockingSync);
    done->record(link);
    c.done_ = std::move(done);
    return c;
  } catch (const c10::Error& e) {
    return CopyError(src.device(), "starting to copy", e);
  }
}

absl::StatusOr<DeviceUse> DeviceCopier::StartDeviceUse(const torch::Tensor& src) {
  if (!src.is_cuda()) return DeviceUse{};
  try {
    const c10::DeviceIndex d = src.device().index();
    const c10::cuda::CUDAGuard device(d);
    const c10::cuda::CUDAStream link = streams_->After(d);
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), link);
    return DeviceUse{link.unwrap(), static_cast<void*>(link.stream())};
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("handing a tensor on ", src.device().str(), " to its link's stream: ", e.what_without_backtrace()));
  }
}

#else  // The CPU build: no device copies can be in flight, so the twin copies synchronously.

struct DeviceCopier::Streams {};

absl::StatusOr<torch::Tensor> HostCopy::Wait() { return host_; }

DeviceCopier::DeviceCopier() = default;
DeviceCopier::~DeviceCopier() = default;

absl::StatusOr<HostCopy> DeviceCopier::StartHostCopy(const torch::Tensor& src) {
  if (src.device().is_cpu()) return HostCopy(src);
  try {
    return HostCopy(src.to(torch::kCPU));
  } catch (const c10::Error& e) {
    return CopyError(src.device(), "copying", e);
  }
}

absl::StatusOr<DeviceUse> DeviceCopier::StartDeviceUse(const torch::Tensor&) { return DeviceUse{}; }

#endif  // LONGHAUL_WITH_CUDA

}  // namespace longhaul::worker
