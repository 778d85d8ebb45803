// The torch glue of the GPU codecs (codec/cuda/gpu_codec.h): the GPU halves of Codec::Encode and
// of the decoders (codec.cc dispatches here), and the payload-level pieces that longhaul-bench
// times. Internal to the codec module and its benchmark; users go through codec.h.
//
// It needs no CUDA headers, so it compiles against a CPU-only LibTorch (whose CUDA tensors cannot
// exist, so these paths are never taken there): device pointers come from data_ptr(), the current
// device is set with LibTorch's device-generic c10::DeviceGuard, LibTorch's current stream is read
// through c10's device-generic interface, and CUDA streams are opaque (gpu::Stream, nullptr = the
// legacy default stream, which is LibTorch's default stream).
//
// Header identity: the GPU paths build their FrameHeader with the same helpers as the CPU paths
// (HeaderFor, FrameParams below); the kernels guarantee the payload's identity.
#ifndef LONGHAUL_CODEC_CODEC_GPU_H_
#define LONGHAUL_CODEC_CODEC_GPU_H_

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/codec.h"
#include "codec/cuda/gpu_codec.h"
#include "codec/frame.h"
#include "codec/spec.h"

namespace longhaul::codec::internal {

// --- shared by the CPU and GPU paths (defined in codec.cc) ---
absl::StatusOr<FrameDtype> DtypeOf(const torch::Tensor& x);
torch::ScalarType TorchType(FrameDtype d);
// The header of a frame of codec `id` for x (dtype and shape of x), params zero.
FrameHeader HeaderFor(const torch::Tensor& x, CodecId id, FrameDtype dtype);
// The 16 parameter bytes a frame of `spec` carries.
std::array<uint8_t, kCodecParamBytes> FrameParams(const CodecSpec& spec);
// Rows for grouped codecs: the last dimension is the channel axis.
void RowsOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* tokens, int64_t* dim);
// BitDP's matrix view of a tensor: rows = first dimension (output channels), cols = the rest.
void MatrixOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* rows, int64_t* cols);

// A quantising frame's payload (group quant, sym quant, BitDP) validated on the host, with what its
// decoders need: validated once, then decoded on the CPU or on a device.
struct ValidatedPayload {
  CodecFamily family = CodecFamily::kGroupQuant;
  absl::string_view payload;  // points into the frame
  int64_t numel = 0;
  GroupQuantParams group_quant;  // kGroupQuant
  GroupQuantLayout layout;
  int64_t tokens = 0, dim = 0;
  SymQuantParams sym_quant;  // kSymQuant
  int bitdp_bits = 0;        // kBitDp
  int64_t rows = 0, cols = 0;
};
// Parses the frame's parameters and validates every payload byte the decoders will read.
absl::StatusOr<ValidatedPayload> ValidatePayload(const FrameView& v);
// Decodes a validated payload into out[numel] (fp32, on the CPU).
void DecodeValidated(const ValidatedPayload& p, int threads, const Kernels& k, float* out);

// --- the GPU paths (codec_gpu.cc) ---

// Whether Encode runs on x's GPU under `device` (see EncodeOptions::device); FailedPrecondition,
// saying why, for kGpu when it cannot. Empty tensors stay on the CPU path (nothing to copy).
absl::StatusOr<bool> UseGpuEncode(const torch::Tensor& x, CodecDevice device);
// Whether decoding to `target` runs on its GPU (see DecodeOptions::device).
absl::StatusOr<bool> UseGpuDecode(const std::optional<torch::Device>& target, CodecDevice device);

// This thread's workspace for CUDA device `index`, created on first use. The caller has made that
// device current (a Workspace belongs to the device current when it first allocates).
gpu::Workspace& ThreadWorkspace(int index);

// Whether LibTorch's current stream on this thread for `d` is `s`, i.e. `s` is nullptr (the legacy
// default stream) and LibTorch's current stream is its default stream.
bool TorchStreamIs(gpu::Stream s, const torch::Device& d);

// x (on a CUDA device, which the caller made current) as the kernels take it: contiguous, 16-byte
// aligned, fp32/fp16/bf16. Ordered before later work on `s`: when LibTorch must copy it and its
// current stream is not `s`, the copy is fenced by synchronising `s` before and LibTorch's stream
// after.
absl::StatusOr<torch::Tensor> KernelInput(const torch::Tensor& x, gpu::Stream s);

// The payload of a quantising codec (group quant, sym quant, BitDP) for `xk` (a KernelInput of the
// tensor whose shape is `shape`), left in `ws`'s device memory: valid until ws's next encode, and
// complete in the order of `s` (the call may return while its kernels run: gpu_codec.h).
absl::StatusOr<gpu::DeviceBytes> EncodePayloadOnGpu(const CodecSpec& spec, const torch::Tensor& xk,
                                                    const std::vector<int64_t>& shape, uint64_t seed,
                                                    gpu::Workspace& ws, gpu::Stream s,
                                                    GroupQuantStats* stats = nullptr);

// Codec::Encode of a quantising codec for a CUDA tensor: the payload on the device, then header +
// payload + CRC on the host.
absl::StatusOr<std::string> EncodeFrameOnGpu(const CodecSpec& spec, const torch::Tensor& x,
                                             const EncodeOptions& o, EncodeStats* stats);
// The body of a raw codec's frame for a CUDA tensor: x cast to `wire` on its device, then copied to
// a CPU tensor (contiguous).
absl::StatusOr<torch::Tensor> RawBodyOnGpu(const torch::Tensor& x, torch::ScalarType wire, gpu::Stream s);

// The kernels' decode of a validated payload already in device memory (`payload_dev`) into fp32
// out[numel] on the device, on stream `s` (nullptr: the legacy default stream).
absl::Status DecodeValidatedOnGpu(const ValidatedPayload& p, const uint8_t* payload_dev, float* out,
                                  gpu::Workspace& ws, gpu::Stream s = nullptr);
// Decodes a validated payload to `device`: uploads it (one synchronous copy), decodes it into a new
// fp32 tensor of `shape` there, and returns it cast to `out_type` on the device. The decode runs on
// the stream `s` (nullptr: the legacy default stream; see DecodeOptions::cuda_stream).
absl::StatusOr<torch::Tensor> DecodeOnGpu(const ValidatedPayload& p, const std::vector<int64_t>& shape,
                                          torch::ScalarType out_type, const torch::Device& device,
                                          gpu::Stream s = nullptr);
// A raw frame's payload (elements of `wire`) uploaded to `device` and cast to `out_type` there.
absl::StatusOr<torch::Tensor> UploadRaw(absl::string_view payload, const std::vector<int64_t>& shape,
                                        torch::ScalarType wire, torch::ScalarType out_type,
                                        const torch::Device& device);

}  // namespace longhaul::codec::internal

#endif  // LONGHAUL_CODEC_CODEC_GPU_H_
