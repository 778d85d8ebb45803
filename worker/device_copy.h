// Device -> host copies of the tensors a link sends (and the hand-over of those it encodes on the
// device, DeviceUse), started on the compute thread and finished on the link's encoder thread, so that the copy of one micro-batch's activations overlaps the compute
// of the next (the issue: a synchronous .to(kCPU) on the encoder thread ran on the default stream
// and serialised with compute).
//
// With the CUDA parts (LONGHAUL_WITH_CUDA), StartHostCopy of a CUDA tensor:
//   1. records an event on the calling thread's current stream of the tensor's device (the stream
//      the stage's compute wrote the tensor on) and makes the copier's own stream wait for it, so
//      the copy reads the finished tensor without stalling compute;
//   2. allocates a pinned host tensor of the same shape and dtype (LibTorch's caching host
//      allocator) and enqueues copy_(src, non_blocking) on the copier's stream;
//   3. tells the CUDA caching allocator that the source's memory is in use on the copier's stream
//      (recordStream), so compute may drop its reference at once: the block is not handed out
//      again before the copy has read it (writing the tensor in place after the start is a race,
//      as it would be for a CPU tensor the link still holds);
//   4. records a completion event on the copier's stream and returns it with the host tensor.
// HostCopy::Wait blocks (without spinning: the event is created with blocking sync) until that
// event has completed; only then may the host tensor be read. The pinned block itself is not
// reused by the host allocator before the copy is done either, even when a HostCopy is dropped
// unwaited (a cancelled link): copy_ records its use on the stream.
//
// Without the CUDA parts (the CPU build) the same interface is a scalar twin: a CPU tensor comes
// back as it is, anything else through a synchronous .to(kCPU).
//
// Threading and ownership: a DeviceCopier belongs to one LinkSender and is used by its compute
// thread only (Send); its streams come lazily from LibTorch's stream pool, one per device the link
// has seen (in practice one). A HostCopy is a value that moves with the queued message from the
// compute thread to the encoder thread (handed over under the LinkSender's mutex), and is used by
// one thread at a time. CPU tensors never need a DeviceCopier: their HostCopy is the tensor.
#ifndef LONGHAUL_WORKER_DEVICE_COPY_H_
#define LONGHAUL_WORKER_DEVICE_COPY_H_

#include <memory>
#include <optional>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::worker {

class HostCopy {
 public:
  HostCopy() = default;
  // A copy that is already done: `host` is a CPU tensor.
  explicit HostCopy(torch::Tensor host) : host_(std::move(host)) {}

  // Blocks until the copy is complete (at once for a CPU tensor or the CPU build), then returns the
  // host tensor. An error (a CUDA fault while copying) names the device.
  absl::StatusOr<torch::Tensor> Wait();
  // Whether Wait may block (a device copy still in flight when it was started).
  bool pending() const { return done_ != nullptr; }

 private:
  friend class DeviceCopier;
  torch::Tensor host_;  // pinned when it comes from a device; not to be read before Wait
  // The completion event on the copier's stream (an at::cuda::CUDAEvent, kept opaque so that this
  // header needs no CUDA headers); null when there is nothing to wait for.
  std::shared_ptr<void> done_;
};

// A CUDA tensor handed from the compute thread to the link's encoder thread for an encode on the
// device (StartDeviceUse). The link's stream already waits on the GPU for the compute that wrote
// the tensor; the encoder runs the codec's kernels on `cuda_stream` with `stream` as LibTorch's
// current stream (StreamGuard), so the encode overlaps the stage's next kernels and its
// synchronisation waits for the encode only. Empty (no stream: the legacy default stream, ordered
// behind compute) for a CPU tensor and in the CPU build.
struct DeviceUse {
  std::optional<c10::Stream> stream;  // LibTorch's handle of the link's stream
  void* cuda_stream = nullptr;        // its cudaStream_t, for codec::EncodeOptions::cuda_stream
};

class DeviceCopier {
 public:
  DeviceCopier();
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Starts copying `src` to the host (see the top of this file). A CPU tensor comes back as it is,
  // with nothing to wait for. Owner (compute) thread only.
  absl::StatusOr<HostCopy> StartHostCopy(const torch::Tensor& src);
  // Steps 1 and 3 of a copy without the copy: the link's stream waits for the compute that wrote
  // `src`, and the allocator keeps src's block from being reused before the work queued on that
  // stream afterwards (the encode) is done. The tensor must still be held until the encode ends.
  // Owner (compute) thread only.
  absl::StatusOr<DeviceUse> StartDeviceUse(const torch::Tensor& src);

 private:
  struct Streams;  // the per-device copy streams (CUDA build), or nothing
  std::unique_ptr<Streams> streams_;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_DEVICE_COPY_H_
