#include "codec/codec.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "codec/bitdp.h"
#include "codec/group_quant.h"
#include "codec/sym_quant.h"
#include "codec/torch_status.h"

namespace longhaul::codec {
namespace {

constexpr uint8_t kRawVersion = 1;
constexpr uint8_t kGroupQuantVersion = 1;
constexpr uint8_t kSymQuantVersion = 1;
constexpr uint8_t kBitDpVersion = 1;

absl::StatusOr<FrameDtype> DtypeOf(const torch::Tensor& x) {
  switch (x.scalar_type()) {
    case torch::kFloat32: return FrameDtype::kFloat32;
    case torch::kFloat16: return FrameDtype::kFloat16;
    case torch::kBFloat16: return FrameDtype::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("codecs take float32/float16/bfloat16 tensors, got ",
                       std::string(c10::toString(x.scalar_type()))));
  }
}

torch::ScalarType TorchType(FrameDtype d) {
  switch (d) {
    case FrameDtype::kFloat16: return torch::kFloat16;
    case FrameDtype::kBFloat16: return torch::kBFloat16;
    case FrameDtype::kFloat32: break;
  }
  return torch::kFloat32;
}

FrameHeader HeaderFor(const torch::Tensor& x, CodecId id, uint8_t version, FrameDtype dtype) {
  FrameHeader h;
  h.codec = id;
  h.codec_version = version;
  h.dtype = dtype;
  h.shape.assign(x.sizes().begin(), x.sizes().end());
  return h;
}

// Rows for grouped codecs: the last dimension is the channel axis.
void RowsOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* tokens, int64_t* dim) {
  *dim = shape.empty() ? 1 : shape.back();
  *tokens = *dim == 0 ? 0 : numel / *dim;
}

// The encode path every quantising codec shares: a float32 CPU view of x, the frame header with
// the codec's parameters, the payload appended in place by `append(data, header, frame)`, the CRC.
template <typename Append>
absl::StatusOr<std::string> EncodeFloatFrame(const torch::Tensor& x, CodecId id, uint8_t version,
                                             const std::array<uint8_t, kCodecParamBytes>& params, Append&& append) {
  return CatchTorch("encode", [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
    if (!dtype.ok()) return dtype.status();
    const torch::Tensor f = x.to(torch::kCPU, torch::kFloat32).contiguous();
    FrameHeader h = HeaderFor(x, id, version, *dtype);
    h.params = params;
    std::string frame = BeginFrame(h);
    if (absl::Status s = append(f.data_ptr<float>(), h, &frame); !s.ok()) return s;
    FinishFrame(&frame);
    return frame;
  });
}

}  // namespace

std::string FrameParts::Join() const {
  std::string out = head;
  if (body.defined()) out.append(static_cast<const char*>(body.data_ptr()), body.nbytes());
  return out;
}

absl::StatusOr<FrameParts> Codec::EncodeParts(const torch::Tensor& x, const EncodeOptions& options,
                                              EncodeStats* stats) const {
  absl::StatusOr<std::string> frame = Encode(x, options, stats);
  if (!frame.ok()) return frame.status();
  FrameParts f;
  f.head = std::move(*frame);
  return f;
}

namespace {

class RawCodec : public Codec {
 public:
  explicit RawCodec(CodecId id) : id_(id) {}
  CodecId id() const override { return id_; }
  std::string spec() const override { return CodecIdName(id_); }

  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions&,
                                     EncodeStats*) const override {
    return CatchTorch("encode", [&]() -> absl::StatusOr<std::string> {
      absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
      if (!dtype.ok()) return dtype.status();
      const torch::Tensor w = x.to(torch::kCPU, WireType()).contiguous();
      return BuildFrame(HeaderFor(x, id_, kRawVersion, *dtype),
                        absl::string_view(static_cast<const char*>(w.data_ptr()), w.nbytes()));
    });
  }

  absl::StatusOr<FrameParts> EncodeParts(const torch::Tensor& x, const EncodeOptions&,
                                         EncodeStats*) const override {
    return CatchTorch("encode", [&]() -> absl::StatusOr<FrameParts> {
      absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
      if (!dtype.ok()) return dtype.status();
      FrameParts f;
      f.body = x.detach().to(torch::kCPU, WireType()).contiguous();  // no copy when x already is
      f.head = BeginFrame(HeaderFor(x, id_, kRawVersion, *dtype));
      FinishFrameHead(&f.head, f.body.data_ptr(), f.body.nbytes());
      return f;
    });
  }

  torch::ScalarType WireType() const {
    return id_ == CodecId::kFp16 ? torch::kFloat16
                                 : id_ == CodecId::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  }

 private:
  CodecId id_;
};

class GroupQuantCodec : public Codec {
 public:
  GroupQuantCodec(CodecId id, GroupQuantParams p) : id_(id), p_(p) {}
  CodecId id() const override { return id_; }

  std::string spec() const override {
    if (id_ == CodecId::kIntK) return absl::StrCat("int", p_.bits_hi, ":g=", p_.group_size);
    return absl::StrCat("tahquant:g=", p_.group_size, ",r=", p_.ratio, ",tau=", p_.tau,
                        ",bits=", p_.bits_hi, "/", p_.bits_lo,
                        ",hadamard=", p_.hadamard ? "on" : "off",
                        ",adaptive=", p_.adaptive ? "on" : "off");
  }

  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o,
                                     EncodeStats* stats) const override {
    return EncodeFloatFrame(x, id_, kGroupQuantVersion, p_.Serialize(),
                            [&](const float* data, const FrameHeader& h, std::string* frame) {
                              int64_t tokens, dim;
                              RowsOf(h.shape, x.numel(), &tokens, &dim);
                              GroupQuantStats gs;
                              absl::Status s = GroupQuantEncode(data, tokens, dim, p_, o.threads,
                                                                o.kernels ? *o.kernels : BestKernels(), frame, &gs);
                              if (s.ok() && stats != nullptr) *stats = {gs.groups, gs.transformed_groups, gs.tokens_hi};
                              return s;
                            });
  }

 private:
  CodecId id_;
  GroupQuantParams p_;
};

// BitDP's matrix view of a tensor: rows = first dimension (output channels), cols = the rest.
void MatrixOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* rows, int64_t* cols) {
  *rows = shape.empty() ? 1 : shape[0];
  *cols = *rows == 0 ? 0 : numel / *rows;
}

// The symmetric-quant presets (SDP4Bit, ZeRO++) share one wire format; the name is kept for spec().
class SymQuantCodec : public Codec {
 public:
  SymQuantCodec(std::string name, SymQuantParams p) : name_(std::move(name)), p_(p) {}
  CodecId id() const override { return CodecId::kSymQuant; }
  std::string spec() const override {
    std::string s = absl::StrCat(name_, ":g=", p_.group_size);
    if (name_ == "sdp4bit-tlqhs" || name_ == "zeropp-qw") absl::StrAppend(&s, ",bits=", p_.bits);
    if (name_ == "sdp4bit-tlqhs") {
      absl::StrAppend(&s, ",rounding=", p_.rounding == Rounding::kStochastic ? "stochastic" : "nearest");
    }
    return s;
  }
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o, EncodeStats*) const override {
    return EncodeFloatFrame(x, CodecId::kSymQuant, kSymQuantVersion, p_.Serialize(),
                            [&](const float* data, const FrameHeader&, std::string* frame) {
                              SymQuantEncode(data, x.numel(), p_, o.seed, frame, 0,
                                             o.kernels ? *o.kernels : BestKernels());
                              return absl::OkStatus();
                            });
  }

 private:
  std::string name_;
  SymQuantParams p_;
};

class BitDpCodec : public Codec {
 public:
  explicit BitDpCodec(int bits) : bits_(bits) {}
  CodecId id() const override { return CodecId::kBitDp; }
  std::string spec() const override { return absl::StrCat("bitdp", bits_); }
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions&, EncodeStats*) const override {
    std::array<uint8_t, kCodecParamBytes> params{};
    params[0] = static_cast<uint8_t>(bits_);
    return EncodeFloatFrame(x, CodecId::kBitDp, kBitDpVersion, params,
                            [&](const float* data, const FrameHeader& h, std::string* frame) {
                              int64_t rows, cols;
                              MatrixOf(h.shape, x.numel(), &rows, &cols);
                              BitDpEncode(data, rows, cols, bits_, frame);
                              return absl::OkStatus();
                            });
  }

 private:
  int bits_;
};

absl::Status BadSpec(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad codec spec \"", spec, "\": ", why));
}

absl::StatusOr<bool> ParseOnOff(absl::string_view v) {
  if (v == "on" || v == "1" || v == "true") return true;
  if (v == "off" || v == "0" || v == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat("expected on/off, got \"", v, "\""));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(absl::string_view spec) {
  std::pair<absl::string_view, absl::string_view> nv = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const absl::string_view name = nv.first;
  if (name == "fp32" || name == "fp16" || name == "bf16") {
    if (!nv.second.empty()) return BadSpec(spec, "raw codecs take no parameters");
    const CodecId id = name == "fp32" ? CodecId::kFp32 : name == "fp16" ? CodecId::kFp16 : CodecId::kBf16;
    return std::make_unique<RawCodec>(id);
  }
  if (name == "bitdp1" || name == "bitdp2") {
    if (!nv.second.empty()) return BadSpec(spec, "bitdp takes no parameters");
    return std::make_unique<BitDpCodec>(name == "bitdp1" ? 1 : 2);
  }
  if (name == "sdp4bit-qwd" || name == "sdp4bit-tlqhs" || name == "zeropp-ulq" || name == "zeropp-qw") {
    SymQuantParams q;
    q.bits = 4;
    q.group_size = name == "sdp4bit-qwd" || name == "zeropp-qw" ? 2048 : 128;
    q.hadamard = name == "sdp4bit-tlqhs";
    if (!nv.second.empty()) {
      for (absl::string_view kv : absl::StrSplit(nv.second, ',')) {
        std::pair<absl::string_view, absl::string_view> f = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        bool ok = true;
        if (f.first == "g") {
          ok = absl::SimpleAtoi(f.second, &q.group_size);
        } else if (f.first == "bits" && (name == "sdp4bit-tlqhs" || name == "zeropp-qw")) {
          ok = absl::SimpleAtoi(f.second, &q.bits) && (q.bits == 4 || q.bits == 8);
          if (!ok) return BadSpec(spec, "bits must be 4 or 8");
        } else if (f.first == "rounding" && name == "sdp4bit-tlqhs") {
          if (f.second != "nearest" && f.second != "stochastic") return BadSpec(spec, "rounding is nearest or stochastic");
          q.rounding = f.second == "stochastic" ? Rounding::kStochastic : Rounding::kNearest;
        } else {
          return BadSpec(spec, absl::StrCat("unknown parameter \"", f.first, "\""));
        }
        if (!ok) return BadSpec(spec, absl::StrCat("cannot parse value of \"", f.first, "\""));
      }
    }
    if (absl::Status st = q.Validate(); !st.ok()) return BadSpec(spec, st.message());
    return std::make_unique<SymQuantCodec>(std::string(name), q);
  }
  GroupQuantParams p;
  CodecId id;
  if (name == "tahquant") {
    id = CodecId::kTahQuant;
  } else if (absl::StartsWith(name, "int")) {
    int bits;
    if (!absl::SimpleAtoi(name.substr(3), &bits) || bits < 2 || bits > 8) {
      return BadSpec(spec, "int<k> needs k in 2..8");
    }
    id = CodecId::kIntK;
    p.bits_hi = p.bits_lo = bits;
    p.ratio = 1.0f;
    p.adaptive = false;
    p.hadamard = false;
  } else {
    return BadSpec(spec,
                   "unknown codec (known: fp32 fp16 bf16 int2..int8 tahquant sdp4bit-qwd sdp4bit-tlqhs zeropp-ulq "
                   "zeropp-qw bitdp1 bitdp2)");
  }
  if (!nv.second.empty()) {
    for (absl::string_view kv : absl::StrSplit(nv.second, ',')) {
      std::pair<absl::string_view, absl::string_view> f = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      const absl::string_view k = f.first, v = f.second;
      bool ok = true;
      if (k == "g") {
        ok = absl::SimpleAtoi(v, &p.group_size);
      } else if (id == CodecId::kTahQuant && k == "r") {
        ok = absl::SimpleAtof(v, &p.ratio);
      } else if (id == CodecId::kTahQuant && k == "tau") {
        ok = absl::SimpleAtof(v, &p.tau);
      } else if (id == CodecId::kTahQuant && k == "bits") {
        std::pair<absl::string_view, absl::string_view> hl = absl::StrSplit(v, absl::MaxSplits('/', 1));
        ok = absl::SimpleAtoi(hl.first, &p.bits_hi) &&
             absl::SimpleAtoi(hl.second.empty() ? hl.first : hl.second, &p.bits_lo);
      } else if (id == CodecId::kTahQuant && (k == "hadamard" || k == "adaptive")) {
        absl::StatusOr<bool> b = ParseOnOff(v);
        if (!b.ok()) return BadSpec(spec, b.status().message());
        (k == "hadamard" ? p.hadamard : p.adaptive) = *b;
      } else {
        return BadSpec(spec, absl::StrCat("unknown parameter \"", k, "\""));
      }
      if (!ok) return BadSpec(spec, absl::StrCat("cannot parse value of \"", k, "\""));
    }
  }
  if (absl::Status s = p.Validate(); !s.ok()) return BadSpec(spec, s.message());
  return std::make_unique<GroupQuantCodec>(id, p);
}

namespace {

// `owner`, when given, holds `frame`'s memory: a raw frame whose payload is already the output
// dtype and suitably aligned is then returned as a tensor over that memory instead of a copy.
absl::Status DecodeImpl(absl::string_view frame, torch::Tensor* out, const DecodeOptions& o,
                        const std::shared_ptr<std::string>* owner) {
  absl::StatusOr<FrameView> v = ParseFrame(frame, o.limits, o.frame_crc);
  if (!v.ok()) return v.status();
  const FrameHeader& h = v->header;
  const torch::ScalarType out_type = TorchType(h.dtype);
  // Reuse *out when it already has the right shape and type; called only after validation.
  auto target = [&](torch::ScalarType type) {
    if (out->defined() && out->device().is_cpu() && out->scalar_type() == type &&
        out->is_contiguous() && out->sizes() == torch::IntArrayRef(h.shape)) {
      return *out;
    }
    return torch::empty(h.shape, torch::TensorOptions().dtype(type));
  };
  absl::StatusOr<torch::Tensor> result = CatchTorch("decode", [&]() -> absl::StatusOr<torch::Tensor> {
    switch (h.codec) {
      case CodecId::kFp32:
      case CodecId::kFp16:
      case CodecId::kBf16: {
        if (h.codec_version != kRawVersion) {
          return absl::InvalidArgumentError(absl::StrCat("unsupported ", CodecIdName(h.codec),
                                                         " version ", h.codec_version));
        }
        for (uint8_t b : h.params) {
          if (b != 0) return absl::InvalidArgumentError("raw codec frame has non-zero parameters");
        }
        const torch::ScalarType wire = h.codec == CodecId::kFp32   ? torch::kFloat32
                                       : h.codec == CodecId::kFp16 ? torch::kFloat16
                                                                   : torch::kBFloat16;
        const uint64_t elem = h.codec == CodecId::kFp32 ? 4 : 2;
        if (h.payload_len != static_cast<uint64_t>(v->numel) * elem) {
          return absl::InvalidArgumentError(
              absl::StrCat(CodecIdName(h.codec), " payload is ", h.payload_len, " bytes, shape needs ",
                           static_cast<uint64_t>(v->numel) * elem));
        }
        const auto* payload = v->payload.data();
        if (wire == out_type && owner != nullptr && v->numel > 0 &&
            reinterpret_cast<uintptr_t>(payload) % elem == 0) {
          return torch::from_blob(const_cast<char*>(payload), h.shape,
                                  [keep = *owner](void*) mutable { keep.reset(); },
                                  torch::TensorOptions().dtype(wire));
        }
        if (wire == out_type) {
          torch::Tensor t = target(wire);
          if (v->numel > 0) std::memcpy(t.data_ptr(), v->payload.data(), h.payload_len);
          return t;
        }
        torch::Tensor t = torch::empty(h.shape, torch::TensorOptions().dtype(wire));
        if (v->numel > 0) std::memcpy(t.data_ptr(), v->payload.data(), h.payload_len);
        return t.to(out_type);
      }
      case CodecId::kIntK:
      case CodecId::kTahQuant: {
        if (h.codec_version != kGroupQuantVersion) {
          return absl::InvalidArgumentError(absl::StrCat("unsupported ", CodecIdName(h.codec),
                                                         " version ", h.codec_version));
        }
        absl::StatusOr<GroupQuantParams> p = GroupQuantParams::Parse(h.params);
        if (!p.ok()) return p.status();
        int64_t tokens, dim;
        RowsOf(h.shape, v->numel, &tokens, &dim);
        absl::StatusOr<GroupQuantLayout> layout = GroupQuantValidate(v->payload, tokens, dim, *p);
        if (!layout.ok()) return layout.status();
        torch::Tensor t = out_type == torch::kFloat32 ? target(torch::kFloat32)
                                                      : torch::empty(h.shape, torch::kFloat32);
        GroupQuantDecode(v->payload, *layout, tokens, dim, *p, o.threads,
                         o.kernels ? *o.kernels : BestKernels(), t.data_ptr<float>());
        return out_type == torch::kFloat32 ? t : t.to(out_type);
      }
      case CodecId::kSymQuant:
      case CodecId::kBitDp: {
        const uint8_t want = h.codec == CodecId::kSymQuant ? kSymQuantVersion : kBitDpVersion;
        if (h.codec_version != want) {
          return absl::InvalidArgumentError(absl::StrCat("unsupported ", CodecIdName(h.codec),
                                                         " version ", h.codec_version));
        }
        torch::Tensor t = out_type == torch::kFloat32 ? target(torch::kFloat32)
                                                      : torch::empty(h.shape, torch::kFloat32);
        if (h.codec == CodecId::kSymQuant) {
          absl::StatusOr<SymQuantParams> p = SymQuantParams::Parse(h.params);
          if (!p.ok()) return p.status();
          if (absl::Status s = SymQuantValidate(v->payload, v->numel, *p); !s.ok()) return s;
          SymQuantDecode(v->payload, v->numel, *p, {}, t.data_ptr<float>());
        } else {
          const int bits = h.params[0];
          for (int i = 1; i < kCodecParamBytes; ++i) {
            if (h.params[i] != 0) return absl::InvalidArgumentError("bitdp frame: non-zero reserved parameter bytes");
          }
          int64_t rows, cols;
          MatrixOf(h.shape, v->numel, &rows, &cols);
          if (absl::Status s = BitDpValidate(v->payload, rows, cols, bits); !s.ok()) return s;
          BitDpDecode(v->payload, rows, cols, bits, t.data_ptr<float>());
        }
        return out_type == torch::kFloat32 ? t : t.to(out_type);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown codec id ", static_cast<int>(h.codec), " in frame"));
  });
  if (!result.ok()) return result.status();
  *out = *std::move(result);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<torch::Tensor> DecodeFrame(absl::string_view frame, const DecodeOptions& o) {
  torch::Tensor out;
  if (absl::Status s = DecodeImpl(frame, &out, o, nullptr); !s.ok()) return s;
  return out;
}

absl::Status DecodeFrameInto(absl::string_view frame, torch::Tensor* out, const DecodeOptions& o) {
  return DecodeImpl(frame, out, o, nullptr);
}

absl::StatusOr<torch::Tensor> DecodeSharedFrame(std::shared_ptr<std::string> frame, const DecodeOptions& o) {
  torch::Tensor out;
  if (absl::Status s = DecodeImpl(*frame, &out, o, &frame); !s.ok()) return s;
  return out;
}

}  // namespace longhaul::codec
