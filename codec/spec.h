// Codec spec strings and the per-codec traits table: everything about a codec that is not its
// kernels — name, wire id, frame version, the parameters its spec accepts and their defaults, the
// wire element type of raw codecs, a line of help text. Plain C++ (no LibTorch), so the control
// plane validates job specs with the same parser the workers use.
//
//   absl::StatusOr<CodecSpec> s = ParseCodecSpec("tahquant:g=32,hadamard=off");
//   CanonicalSpec(*s);   // "tahquant:g=32,r=0.8,tau=2,bits=4/3,hadamard=off,adaptive=on"
//   FrameVersion(CodecId::kTahQuant);   // the codec version its frames carry (frame.h)
//
// Spec syntax: NAME[:KEY=VALUE,...]. The table has one row per name; "int<k>" stands for int2..int8
// (k is part of the name, not a parameter). Keys a row does not accept are errors. The canonical
// form names every accepted key, in the order g, r, tau, bits, hadamard, adaptive, rounding, so
// ParseCodecSpec(CanonicalSpec(s)) == s (floats print with 6 significant digits: values given
// with more digits round trip to the nearest 6-digit value, not to themselves).
//
// Adding a codec: a row in kCodecTable (spec.cc), its CodecId (frame.h), and its encoder and
// decoder in codec.cc (the decoder's switch is on CodecFamily).
//
// Thread safety: the table is constant; every function here is pure.
#ifndef LONGHAUL_CODEC_SPEC_H_
#define LONGHAUL_CODEC_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codec/frame.h"
#include "codec/group_quant.h"
#include "codec/sym_quant.h"

namespace longhaul::codec {

// Which engine encodes the payload; rows of one family share a decoder.
enum class CodecFamily : uint8_t {
  kRaw,         // the tensor's elements in the wire dtype (fp32, fp16, bf16)
  kGroupQuant,  // grouped asymmetric quantisation, group_quant.h (int<k>, tahquant)
  kSymQuant,    // symmetric per-group quantisation, sym_quant.h (sdp4bit-*, zeropp-*)
  kBitDp,       // BitDP bit planes, bitdp.h (bitdp1, bitdp2)
};

// The keys a spec may set (a row's `params` is a mask of these).
enum SpecParam : uint32_t {
  kParamGroup = 1u << 0,     // g=G          group size
  kParamRatio = 1u << 1,     // r=R          fraction of tokens at the high bit width
  kParamTau = 1u << 2,       // tau=T        outlier threshold
  kParamBits = 1u << 3,      // bits=H/L (group quant: high/low widths) | bits=4|8 (sym quant)
  kParamHadamard = 1u << 4,  // hadamard=on|off
  kParamAdaptive = 1u << 5,  // adaptive=on|off
  kParamRounding = 1u << 6,  // rounding=nearest|stochastic
};

struct CodecTraits {
  const char* name;       // spec name; "int<k>" for the int2..int8 family
  CodecId id;             // on the wire; several rows may share one (all sym-quant presets)
  uint8_t frame_version;  // codec version its frames carry; rows sharing an id agree
  CodecFamily family;
  uint32_t params;        // accepted SpecParam keys; 0: the spec takes none
  // Defaults, before the spec's keys apply (only the family's own field is used).
  GroupQuantParams group_quant;  // kGroupQuant (int<k>: bits_hi = bits_lo = k, set from the name)
  SymQuantParams sym_quant;      // kSymQuant
  int bitdp_bits;                // kBitDp: 1 or 2
  // kRaw: the payload is the tensor's elements as wire_dtype, wire_bytes each.
  FrameDtype wire_dtype;
  int wire_bytes;                // 0 for packed (non-raw) codecs
  const char* description;       // one line of help text
};

// Every codec, in the order help text lists them.
absl::Span<const CodecTraits> CodecTable();

// The row for a spec name: exact names, and "int" followed by anything for the int<k> row (whether
// k is valid is ParseCodecSpec's question). nullptr for an unknown name.
const CodecTraits* FindCodecTraits(absl::string_view name);

// The first row with this wire id (for raw codecs, the only one); nullptr for an unknown id.
const CodecTraits* CodecTraitsFor(CodecId id);

// The codec version frames of this id carry; nullopt for an unknown id.
std::optional<uint8_t> FrameVersion(CodecId id);

// A parsed spec: the row's name (int<k>: "int2".."int8") and the parameters of its family.
struct CodecSpec {
  CodecId id = CodecId::kFp32;
  std::string name = "fp32";
  GroupQuantParams group_quant;  // kIntK, kTahQuant
  SymQuantParams sym_quant;      // kSymQuant
  int bitdp_bits = 0;            // kBitDp

  // Equal when they name the same codec with the same parameters (fields of other families are
  // ignored).
  friend bool operator==(const CodecSpec& a, const CodecSpec& b);
  friend bool operator!=(const CodecSpec& a, const CodecSpec& b) { return !(a == b); }
};

// Parses NAME[:KEY=VALUE,...]. Errors are InvalidArgument "bad codec spec \"<spec>\": <why>", why
// being one of: unknown codec (known: ...), int<k> needs k in 2..8, raw codecs take no parameters,
// bitdp takes no parameters, unknown parameter "<key>", cannot parse value of "<key>", bits must be
// 4 or 8, rounding is nearest or stochastic, expected on/off, got "<value>", or the parameter
// structs' own Validate() message.
absl::StatusOr<CodecSpec> ParseCodecSpec(absl::string_view spec);

// Where a codec runs for tensors on (or decoded to) a CUDA device (the job spec's
// links.codec_device; codec.h's EncodeOptions/DecodeOptions):
//   kAuto  on the GPU when the GPU codecs are available, else on the CPU (the tensor is copied)
//   kCpu   always on the CPU
//   kGpu   on the GPU; an error (FailedPrecondition, saying why) when that is not possible
enum class CodecDevice { kAuto, kCpu, kGpu };
// "auto" | "cpu" | "gpu"; anything else is InvalidArgument naming the three.
absl::StatusOr<CodecDevice> ParseCodecDevice(absl::string_view name);
const char* CodecDeviceName(CodecDevice d);

// The canonical spec string (what Codec::spec() returns); `s` must come from ParseCodecSpec.
std::string CanonicalSpec(const CodecSpec& s);

// Spec syntax of a row, e.g. "zeropp-qw[:g=G,bits=4|8]", derived from its accepted keys.
std::string SpecSynopsis(const CodecTraits& t);

// Help text for --help: one line per row, synopsis and description, each line indented by
// `indent` spaces and ending in '\n'.
std::string CodecHelp(int indent = 2);

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_SPEC_H_
