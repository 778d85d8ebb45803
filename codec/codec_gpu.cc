#include "codec/codec_gpu.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "absl/strings/str_cat.h"
#include "common/torch_status.h"

namespace longhaul::codec {

// The probe runs once: cudaGetDeviceCount on every encode would cost a driver call per frame, and
// the devices a process sees do not change while it runs.
bool GpuCodecsAvailable(std::string* why) {
  static const std::pair<bool, std::string>* const probe = [] {
    auto* p = new std::pair<bool, std::string>();
    p->first = gpu::Available(&p->second);
    return p;
  }();
  if (!probe->first && why != nullptr) *why = probe->second;
  return probe->first;
}

absl::StatusOr<bool> EncodesOnGpu(const torch::Tensor& x, CodecDevice device) {
  return internal::UseGpuEncode(x, device);
}

namespace internal {
namespace {

const c10::impl::DeviceGuardImplInterface* Impl(const torch::Device& d) {
  return c10::impl::getDeviceGuardImpl(d.type());
}

// `d` with its index: "cuda" alone means the current device (the caller holds a DeviceGuard).
torch::Device WithIndex(const torch::Device& d) {
  return d.has_index() ? d : torch::Device(d.type(), Impl(d)->getDevice().index());
}

// Blocks until the work queued so far on LibTorch's current stream for `d` has finished.
void SynchronizeTorchStream(const torch::Device& d) { Impl(d)->getStream(d).synchronize(); }

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;  // ParseFrame checked the product
  return n;
}

}  // namespace

namespace {

// Whether the GPU codecs can run; kGpu without them is an error naming why, kAuto falls back.
absl::StatusOr<bool> GpuCodecsFor(CodecDevice device) {
  std::string why;
  if (GpuCodecsAvailable(&why)) return true;
  if (device == CodecDevice::kGpu) {
    return absl::FailedPreconditionError(absl::StrCat("codec device gpu: the GPU codecs are not available: ", why));
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> UseGpuEncode(const torch::Tensor& x, CodecDevice device) {
  if (device == CodecDevice::kCpu || !x.defined()) return false;
  if (!x.is_cuda()) {
    if (device == CodecDevice::kGpu) {
      return absl::FailedPreconditionError(absl::StrCat("codec device gpu: the tensor is on ", x.device().str(),
                                                        ", not on a CUDA device"));
    }
    return false;
  }
  absl::StatusOr<bool> gpu = GpuCodecsFor(device);
  if (!gpu.ok() || !*gpu) return gpu;
  return x.numel() > 0;  // an empty tensor has no bytes to copy: the CPU path writes its frame
}

absl::StatusOr<bool> UseGpuDecode(const std::optional<torch::Device>& target, CodecDevice device) {
  if (device == CodecDevice::kCpu) return false;
  if (!target.has_value() || !target->is_cuda()) {
    if (device == CodecDevice::kGpu) {
      return absl::FailedPreconditionError(absl::StrCat("codec device gpu: decoding on a GPU needs a CUDA target device, not ",
                                                        target.has_value() ? target->str() : std::string("the CPU")));
    }
    return false;
  }
  return GpuCodecsFor(device);
}

gpu::Workspace& ThreadWorkspace(int index) {
  // Codec objects are shared and immutable, so the scratch memory is the thread's: one workspace
  // per thread and device, freed when the thread ends.
  thread_local std::map<int, std::unique_ptr<gpu::Workspace>> by_device;
  std::unique_ptr<gpu::Workspace>& w = by_device[index];
  if (w == nullptr) w = std::make_unique<gpu::Workspace>();
  return *w;
}

bool TorchStreamIs(gpu::Stream s, const torch::Device& d) {
  // LibTorch's default CUDA stream is the legacy default stream (its handle is null); a non-null
  // handle cannot be compared without the CUDA headers, so it counts as different (the callers
  // then only synchronise more than needed).
  if (s != nullptr) return false;
  const c10::impl::DeviceGuardImplInterface* impl = Impl(d);
  return impl->getStream(d) == impl->getDefaultStream(d);
}

absl::StatusOr<torch::Tensor> KernelInput(const torch::Tensor& x, gpu::Stream s) {
  absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
  if (!dtype.ok()) return dtype.status();
  torch::Tensor t = x.detach();
  // 16-byte alignment lets the kernels load whole vectors; LibTorch's own allocations are aligned
  // far beyond that, so only views at odd offsets are copied.
  if (t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) return t;
  const torch::Device d = WithIndex(t.device());
  const bool same = TorchStreamIs(s, d);
  // x is ready for work on `s` (the caller's contract), not necessarily for LibTorch's stream.
  if (!same) {
    if (absl::Status st = gpu::Synchronize(s); !st.ok()) return st;
  }
  t = t.clone(at::MemoryFormat::Contiguous);
  if (!same) SynchronizeTorchStream(d);  // the copy is done before the kernels on `s` read it
  return t;
}

absl::StatusOr<gpu::DeviceBytes> EncodePayloadOnGpu(const CodecSpec& spec, const torch::Tensor& xk,
                                                    const std::vector<int64_t>& shape, uint64_t seed,
                                                    gpu::Workspace& ws, gpu::Stream s, GroupQuantStats* stats) {
  absl::StatusOr<FrameDtype> dtype = DtypeOf(xk);
  if (!dtype.ok()) return dtype.status();
  const int64_t numel = xk.numel();
  const void* data = xk.data_ptr();
  switch (CodecTraitsFor(spec.id)->family) {
    case CodecFamily::kGroupQuant: {
      int64_t tokens, dim;
      RowsOf(shape, numel, &tokens, &dim);
      return gpu::GroupQuantEncode(data, *dtype, tokens, dim, spec.group_quant, ws, s, stats);
    }
    case CodecFamily::kSymQuant:
      return gpu::SymQuantEncode(data, *dtype, numel, spec.sym_quant, seed, ws, s);
    case CodecFamily::kBitDp: {
      int64_t rows, cols;
      MatrixOf(shape, numel, &rows, &cols);
      return gpu::BitDpEncode(data, *dtype, rows, cols, spec.bitdp_bits, ws, s);
    }
    case CodecFamily::kRaw: break;
  }
  return absl::InvalidArgumentError(absl::StrCat(spec.name, " has no device payload: its payload is the tensor's elements"));
}

absl::StatusOr<std::string> EncodeFrameOnGpu(const CodecSpec& spec, const torch::Tensor& x,
                                             const EncodeOptions& o, EncodeStats* stats) {
  return CatchTorch("encode on the GPU", [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
    if (!dtype.ok()) return dtype.status();
    const c10::DeviceGuard on_device(x.device());
    const gpu::Stream s = o.cuda_stream;
    absl::StatusOr<torch::Tensor> xk = KernelInput(x, s);
    if (!xk.ok()) return xk.status();
    // The same header as the CPU path's (HeaderFor, FrameParams): with the kernels' payload the
    // frame is byte-identical.
    FrameHeader h = HeaderFor(x, spec.id, *dtype);
    h.params = FrameParams(spec);
    GroupQuantStats gs;
    absl::StatusOr<gpu::DeviceBytes> payload =
        EncodePayloadOnGpu(spec, *xk, h.shape, o.seed, ThreadWorkspace(x.device().index()), s, &gs);
    if (!payload.ok()) return payload.status();
    std::string frame = BeginFrame(h);
    if (absl::Status st = gpu::AppendToHost(*payload, s, &frame); !st.ok()) return st;
    FinishFrame(&frame);
    if (stats != nullptr && CodecTraitsFor(spec.id)->family == CodecFamily::kGroupQuant) {
      *stats = {gs.groups, gs.transformed_groups, gs.tokens_hi};
    }
    return frame;
  });
}

absl::StatusOr<torch::Tensor> RawBodyOnGpu(const torch::Tensor& x, torch::ScalarType wire, gpu::Stream s) {
  return CatchTorch("encode on the GPU", [&]() -> absl::StatusOr<torch::Tensor> {
    const c10::DeviceGuard on_device(x.device());
    // All of it is LibTorch's work, on its current stream; x is ready for `s`.
    if (!TorchStreamIs(s, WithIndex(x.device()))) {
      if (absl::Status st = gpu::Synchronize(s); !st.ok()) return st;
    }
    // The cast on the device (no copy when x already is the wire dtype), then one copy to the host,
    // which waits for it.
    return x.detach().to(wire).contiguous().to(torch::kCPU);
  });
}

absl::Status DecodeValidatedOnGpu(const ValidatedPayload& p, const uint8_t* payload_dev, float* out,
                                  gpu::Workspace& ws, gpu::Stream s) {
  switch (p.family) {
    case CodecFamily::kGroupQuant:
      return gpu::GroupQuantDecode(payload_dev, p.layout, p.tokens, p.dim, p.group_quant, out, ws, s);
    case CodecFamily::kSymQuant: return gpu::SymQuantDecode(payload_dev, p.numel, p.sym_quant, out, s);
    case CodecFamily::kBitDp: return gpu::BitDpDecode(payload_dev, p.rows, p.cols, p.bitdp_bits, out, s);
    case CodecFamily::kRaw: break;
  }
  return absl::InternalError("a raw frame has no payload decoder");
}

absl::StatusOr<torch::Tensor> DecodeOnGpu(const ValidatedPayload& p, const std::vector<int64_t>& shape,
                                          torch::ScalarType out_type, const torch::Device& device,
                                          gpu::Stream s) {
  const absl::string_view payload = p.payload;
  return CatchTorch("decode on the GPU", [&]() -> absl::StatusOr<torch::Tensor> {
    const c10::DeviceGuard on_device(device);
    const torch::Device d = WithIndex(device);
    const torch::TensorOptions on_d = torch::TensorOptions().device(d);
    if (Elements(shape) == 0) return torch::empty(shape, on_d.dtype(out_type));
    // LibTorch allocates on its current stream; the copy and the kernels run on `s`. When those
    // differ, LibTorch's stream is drained before (the blocks may still be in use there) and `s`
    // after (the result, and the payload block LibTorch frees below).
    const bool same = TorchStreamIs(s, d);
    torch::Tensor bytes = torch::empty({static_cast<int64_t>(payload.size())}, on_d.dtype(torch::kUInt8));
    torch::Tensor out = torch::empty(shape, on_d.dtype(torch::kFloat32));
    if (!same) SynchronizeTorchStream(d);
    if (absl::Status st = gpu::Upload(bytes.data_ptr(), payload.data(), payload.size(), s); !st.ok()) return st;
    if (absl::Status st =
            DecodeValidatedOnGpu(p, bytes.data_ptr<uint8_t>(), out.data_ptr<float>(), ThreadWorkspace(d.index()), s);
        !st.ok()) {
      return st;
    }
    if (!same) {
      if (absl::Status st = gpu::Synchronize(s); !st.ok()) return st;
    }
    return out_type == torch::kFloat32 ? out : out.to(out_type);
  });
}

absl::StatusOr<torch::Tensor> UploadRaw(absl::string_view payload, const std::vector<int64_t>& shape,
                                        torch::ScalarType wire, torch::ScalarType out_type,
                                        const torch::Device& device) {
  return CatchTorch("decode on the GPU", [&]() -> absl::StatusOr<torch::Tensor> {
    const c10::DeviceGuard on_device(device);
    const torch::Device d = WithIndex(device);
    if (Elements(shape) == 0) return torch::empty(shape, torch::TensorOptions().device(d).dtype(out_type));
    // As bytes: the payload need not be aligned for its dtype in the frame. The copy to the device is
    // LibTorch's, on its current stream, and so is the cast.
    const torch::Tensor host = torch::from_blob(const_cast<char*>(payload.data()),
                                                {static_cast<int64_t>(payload.size())}, torch::kUInt8);
    return host.to(d).view(wire).reshape(shape).to(out_type);
  });
}

}  // namespace internal
}  // namespace longhaul::codec
