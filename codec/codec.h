// Tensor codecs: encode a torch::Tensor into one self-describing frame (frame.h); decode any frame
// back, whatever codec wrote it.
//
//   auto codec = MakeCodec("tahquant:g=64,r=0.8");          // or "fp32", "bf16", "int8:g=32", ...
//   absl::StatusOr<std::string> frame = (*codec)->Encode(activations);
//   absl::StatusOr<torch::Tensor> x = DecodeFrame(*frame);  // same shape and dtype as the input
//
// Spec strings (MakeCodec, and Codec::spec() which prints the canonical form) are parsed by
// ParseCodecSpec (spec.h), whose traits table has one row per codec: fp32 fp16 bf16 int2..int8
// tahquant sdp4bit-qwd sdp4bit-tlqhs zeropp-ulq zeropp-qw bitdp1 bitdp2, with the parameters each
// accepts and their defaults (CodecHelp() prints them). For example:
//   int<k>[:g=G]                        k = 2..8, uniform asymmetric per group of G (default 64)
//   tahquant[:g=G,r=R,tau=T,bits=H/L,hadamard=on|off,adaptive=on|off]
//                                       TAH-Quant; defaults g=64 r=0.8 tau=2 bits=4/3
//   sdp4bit-tlqhs[:g=G,bits=4|8,rounding=nearest|stochastic]
//                                       TLq-HS wire format: block-32 Hadamard fused with symmetric
//                                       INT-B (B=4 slow level, default; 8 fast level), g=128
//   bitdp1 | bitdp2                     BitDP 1-bit / 2-bit ternary per output channel (first
//                                       dimension = output channels); see bitdp.h
// The collective-level pieces (reduce in the Hadamard domain, gather-and-reduce of BitDP planes,
// qWD model sync, simulations of P replicas) are in sdp4bit.h and bitdp.h.
// Inputs may be float32, float16 or bfloat16 of any shape; grouped codecs group along the last
// dimension.
//
// CUDA tensors (codec/cuda/gpu_codec.h has the kernels): a CUDA tensor is encoded on its device
// unless EncodeOptions::device is kCpu or the GPU codecs are not available (GpuCodecsAvailable);
// only the frame's bytes then cross PCIe, and the frame is byte-identical to the CPU's. Decoding
// to a CUDA device (DecodeOptions::device) validates the frame on the host as always, uploads the
// compressed bytes and decodes there. Tensors on other devices are copied to the CPU.
//
// Thread safety: Codec objects are immutable after MakeCodec; Encode may run concurrently. The GPU
// paths keep their scratch memory per thread and device.
#ifndef LONGHAUL_CODEC_CODEC_H_
#define LONGHAUL_CODEC_CODEC_H_

#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/cpu/kernels.h"
#include "codec/frame.h"
#include "codec/spec.h"

namespace longhaul::codec {

// CodecDevice (where a codec runs for CUDA tensors) and ParseCodecDevice are in spec.h.

// Whether this process can run the codecs on CUDA devices: the kernels are built in
// (LONGHAUL_CODEC_CUDA) and a GPU is visible. `why` (optional) says why not.
bool GpuCodecsAvailable(std::string* why = nullptr);

// Whether Encode runs on x's GPU under `device` (EncodeOptions::device): FailedPrecondition, saying
// why, for kGpu when it cannot. Empty tensors take the CPU path (nothing to copy).
absl::StatusOr<bool> EncodesOnGpu(const torch::Tensor& x, CodecDevice device);

struct EncodeOptions {
  int threads = 1;
  const Kernels* kernels = nullptr;  // nullptr: BestKernels()
  uint64_t seed = 0;                 // stochastic rounding draws (same seed, same frame)
  // A CUDA tensor is encoded on its device when `device` is not kCpu and GpuCodecsAvailable();
  // with kAuto it is otherwise copied to the CPU and encoded there, with kGpu that is an error
  // (FailedPrecondition naming the reason, also for a tensor that is not on a CUDA device). CPU
  // tensors are encoded on the CPU under kAuto and kCpu.
  CodecDevice device = CodecDevice::kAuto;
  // The CUDA stream (a cudaStream_t) the GPU encode runs on; nullptr: the legacy default stream,
  // which is LibTorch's default stream, so work LibTorch queued there before (the tensor's
  // producer, on any thread) is ordered before the encode. With another stream the caller orders
  // the tensor's producer before it (an event). Encode returns after the stream has done the work
  // (the frame is on the host). LibTorch operations the encode needs (a non-contiguous tensor made
  // contiguous, the cast of the fp16/bf16 codecs) run on LibTorch's current stream; the encoder
  // synchronises around them when that is not `cuda_stream`.
  void* cuda_stream = nullptr;
};

struct DecodeOptions {
  int threads = 1;
  const Kernels* kernels = nullptr;
  // Class members carry explicit initialisers so that `{threads, kernels}` aggregate
  // initialisation does not trip -Wmissing-field-initializers.
  DecodeLimits limits{};
  // The frame's checksum as computed while it arrived (FrameCrc, frame.h), so that decoding does
  // not read the payload once more to check it. Unset: the decoder computes it.
  std::optional<uint32_t> frame_crc = std::nullopt;
  // Where the result lives; unset: the CPU. For a CUDA device the frame is still validated on the
  // host; then, when `codec_device` is not kCpu and GpuCodecsAvailable(), its compressed bytes are
  // uploaded (one copy) and decoded on the device (fp32, then cast there for fp16/bf16 frames; raw
  // frames are uploaded and cast). Otherwise (kAuto, kCpu) it is decoded on the CPU and copied to
  // the device; kGpu without the GPU codecs, or with a target that is not a CUDA device, is
  // FailedPrecondition. The device work runs on `cuda_stream` and may still be in flight when the
  // call returns when that is LibTorch's current stream: work queued there afterwards sees the
  // result; otherwise the call waits for it.
  std::optional<torch::Device> device = std::nullopt;
  CodecDevice codec_device = CodecDevice::kAuto;
  // The CUDA stream (a cudaStream_t) of a device decode; nullptr: the legacy default stream,
  // LibTorch's default stream.
  void* cuda_stream = nullptr;
};

struct EncodeStats {
  int64_t groups = 0;
  int64_t transformed_groups = 0;  // TAH-Quant outlier groups (pivot + Hadamard)
  int64_t tokens_hi = 0;           // tokens given the higher bit width
};

// A frame in two pieces: `head`, then the bytes of `body` (a contiguous CPU tensor, or undefined).
// Concatenated they are exactly the frame Encode() returns.
struct FrameParts {
  std::string head;
  torch::Tensor body;
  size_t size() const { return head.size() + (body.defined() ? body.nbytes() : 0); }
  std::string Join() const;  // the frame as one string (a copy)
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  // Canonical spec string; MakeCodec(spec()) builds an identical codec.
  virtual std::string spec() const = 0;
  virtual absl::StatusOr<std::string> Encode(const torch::Tensor& x,
                                             const EncodeOptions& options = {},
                                             EncodeStats* stats = nullptr) const = 0;
  // The same frame without copying the payload where the codec's payload is the tensor's own
  // bytes (fp32/fp16/bf16 of a matching dtype): `body` then shares the tensor's memory, which
  // must not change until the frame is sent (its CRC is already computed). Other codecs return
  // the whole frame in `head`.
  virtual absl::StatusOr<FrameParts> EncodeParts(const torch::Tensor& x, const EncodeOptions& options = {},
                                                 EncodeStats* stats = nullptr) const;
};

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(absl::string_view spec);

// Validates the whole frame before allocating the output, then decodes it.
absl::StatusOr<torch::Tensor> DecodeFrame(absl::string_view frame,
                                          const DecodeOptions& options = {});

// Decodes into `out`, reusing its storage when it is a contiguous CPU tensor of the frame's shape
// and dtype and the target is the CPU (receive buffers on a pipeline link are reused step after
// step); otherwise `out` is replaced by a new tensor. On error `out` is left as it was.
absl::Status DecodeFrameInto(absl::string_view frame, torch::Tensor* out,
                             const DecodeOptions& options = {});

// Like DecodeFrame, but fp32/fp16/bf16 frames whose payload is already the output dtype are not
// copied: the tensor aliases the frame's memory and keeps `frame` alive (the receive path hands its
// reassembly buffer over this way; the caller must not touch `frame` afterwards, the tensor may be
// written). Other codecs, and any decode to a device other than the CPU, decode into new memory.
absl::StatusOr<torch::Tensor> DecodeSharedFrame(std::shared_ptr<std::string> frame,
                                                const DecodeOptions& options = {});

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CODEC_H_
