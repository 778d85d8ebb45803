// Device memory, workspaces and copies for the GPU codecs (gpu_codec.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"

namespace longhaul::codec::gpu {

bool Available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why != nullptr) {
      *why = e != cudaSuccess ? absl::StrCat("no usable CUDA device (", cudaGetErrorString(e), ")")
                              : std::string("no CUDA device is visible");
    }
    cudaGetLastError();  // clear the sticky error of a failed query
    return false;
  }
  return true;
}

namespace {

// A figure of a kernel on the current device that its launches need and that does not change:
// computed by compute(device) the first time and cached under (kernel, arg, device) (the
// queries cost microseconds, before a launch that may take tens). `Tag` keeps each figure's
// cache apart.
template <typename Tag, typename F>
absl::StatusOr<int> PerKernel(const void* kernel, int arg, F&& compute) {
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<const void*, int, int>, int>;
  int device = 0;
  LONGHAUL_CUDA_OK(cudaGetDevice(&device));
  const auto key = std::make_tuple(kernel, arg, device);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  absl::StatusOr<int> v = compute(device);
  if (!v.ok()) return v.status();
  std::lock_guard<std::mutex> lock(mu);
  cache->emplace(key, *v);
  return *v;
}

}  // namespace

absl::StatusOr<int> ResidentBlocks(const void* kernel, int threads) {
  struct Tag;
  return PerKernel<Tag>(kernel, threads, [&](int device) -> absl::StatusOr<int> {
    int sms = 0, per_sm = 0;
    LONGHAUL_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    LONGHAUL_CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    return std::max(1, per_sm * sms);
  });
}

absl::StatusOr<bool> DependentLaunches(const void* kernel) {
  struct Tag;
  absl::StatusOr<int> ptx = PerKernel<Tag>(kernel, 0, [&](int) -> absl::StatusOr<int> {
    cudaFuncAttributes attr{};
    LONGHAUL_CUDA_OK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion;
  });
  if (!ptx.ok()) return ptx.status();
  return *ptx >= 90;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes > 0) LONGHAUL_CUDA_OK(cudaMalloc(&b.data_, bytes));
  b.size_ = bytes;
  return b;
}

Workspace::Workspace() = default;

Workspace::~Workspace() {
  for (void* p : scratch_) {
    if (p != nullptr) cudaFree(p);
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (staging_read_ != nullptr) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(staging_read_));  // the last copy out of staging_ is done
    cudaEventDestroy(static_cast<cudaEvent_t>(staging_read_));
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

absl::StatusOr<void*> Workspace::Scratch(int slot, size_t bytes) {
  absl::StatusOr<void*> p = Grow(slot, bytes);
  if (p.ok()) zeroed_[slot] = false;  // its user may write anything
  return p;
}

absl::StatusOr<void*> Workspace::ZeroedScratch(int slot, size_t bytes, Stream s) {
  absl::StatusOr<void*> p = Grow(slot, bytes);
  if (!p.ok() || zeroed_[slot]) return p;
  LONGHAUL_CUDA_OK(cudaMemsetAsync(*p, 0, scratch_size_[slot], AsStream(s)));
  zeroed_[slot] = true;
  return p;
}

void Workspace::MarkDirty(int slot) {
  if (slot >= 0 && slot < kSlots) zeroed_[slot] = false;
}

absl::StatusOr<void*> Workspace::Grow(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) return absl::InternalError(absl::StrCat("workspace slot ", slot));
  if (bytes == 0) bytes = 1;
  if (scratch_size_[slot] < bytes) {
    zeroed_[slot] = false;
    if (scratch_[slot] != nullptr) {
      // Earlier work on any stream may still use the old block.
      LONGHAUL_CUDA_OK(cudaDeviceSynchronize());
      LONGHAUL_CUDA_OK(cudaFree(scratch_[slot]));
      scratch_[slot] = nullptr;
      scratch_size_[slot] = 0;
    }
    // Grow by half again, so a slowly growing tensor does not reallocate every call.
    const size_t want = bytes + bytes / 2;
    LONGHAUL_CUDA_OK(cudaMalloc(&scratch_[slot], want));
    scratch_size_[slot] = want;
  }
  return scratch_[slot];
}

absl::StatusOr<void*> Workspace::Pinned() {
  if (pinned_ == nullptr) {
    LONGHAUL_CUDA_OK(cudaMallocHost(&pinned_, kPinnedBytes));
    std::memset(pinned_, 0, kPinnedBytes);
  }
  return pinned_;
}

absl::StatusOr<void*> Workspace::PinnedOnDevice() {
  if (pinned_dev_ == nullptr) {
    absl::StatusOr<void*> host = Pinned();
    if (!host.ok()) return host.status();
    LONGHAUL_CUDA_OK(cudaHostGetDevicePointer(&pinned_dev_, *host, 0));
  }
  return pinned_dev_;
}

absl::Status Workspace::UploadAsync(void* dst_dev, const void* src_host, size_t n, Stream s) {
  if (n == 0) return absl::OkStatus();
  if (staging_read_ == nullptr) {
    cudaEvent_t e = nullptr;
    LONGHAUL_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    staging_read_ = e;
  } else {
    LONGHAUL_CUDA_OK(cudaEventSynchronize(static_cast<cudaEvent_t>(staging_read_)));
  }
  if (staging_size_ < n) {
    if (staging_ != nullptr) LONGHAUL_CUDA_OK(cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_size_ = 0;
    const size_t want = n + n / 2;
    LONGHAUL_CUDA_OK(cudaMallocHost(&staging_, want));
    staging_size_ = want;
  }
  std::memcpy(staging_, src_host, n);
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(dst_dev, staging_, n, cudaMemcpyHostToDevice, AsStream(s)));
  if (absl::Status st = CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(staging_read_), AsStream(s)),
                                   "staging event");
      !st.ok()) {
    // Without the event the next call could not tell when this copy is done: wait for it here.
    (void)cudaStreamSynchronize(AsStream(s));
    return st;
  }
  return absl::OkStatus();
}

absl::Status Upload(void* dst, const void* src, size_t n, Stream s) {
  if (n == 0) return absl::OkStatus();
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, AsStream(s)));
  return CudaStatus(cudaStreamSynchronize(AsStream(s)), "upload");
}

absl::Status Download(void* dst, const void* src, size_t n, Stream s) {
  if (n == 0) return absl::OkStatus();
  LONGHAUL_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, AsStream(s)));
  return CudaStatus(cudaStreamSynchronize(AsStream(s)), "download");
}

absl::Status CopyOnDevice(void* dst, const void* src, size_t n, Stream s) {
  if (n == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, AsStream(s)), "device copy");
}

absl::Status Synchronize(Stream s) { return CudaStatus(cudaStreamSynchronize(AsStream(s)), "synchronize"); }

absl::Status AppendToHost(const DeviceBytes& payload, Stream s, std::string* out) {
  const size_t base = out->size();
  out->resize(base + payload.size);
  return Download(out->data() + base, payload.data, payload.size, s);
}

}  // namespace longhaul::codec::gpu
