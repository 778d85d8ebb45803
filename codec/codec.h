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
// dimension. Tensors on other devices are copied to the CPU (CUDA kernels are a later backend;
// the interface does not change).
//
// Thread safety: Codec objects are immutable after MakeCodec; Encode may run concurrently.
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

namespace longhaul::codec {

struct EncodeOptions {
  int threads = 1;
  const Kernels* kernels = nullptr;  // nullptr: BestKernels()
  uint64_t seed = 0;                 // stochastic rounding draws (same seed, same frame)
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
// and dtype (receive buffers on a pipeline link are reused step after step); otherwise `out` is
// replaced by a new tensor. On error `out` is left as it was.
absl::Status DecodeFrameInto(absl::string_view frame, torch::Tensor* out,
                             const DecodeOptions& options = {});

// Like DecodeFrame, but fp32/fp16/bf16 frames whose payload is already the output dtype are not
// copied: the tensor aliases the frame's memory and keeps `frame` alive (the receive path hands its
// reassembly buffer over this way; the caller must not touch `frame` afterwards, the tensor may be
// written). Other codecs decode into new memory as usual.
absl::StatusOr<torch::Tensor> DecodeSharedFrame(std::shared_ptr<std::string> frame,
                                                const DecodeOptions& options = {});

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CODEC_H_
