#include "codec/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/bitdp.h"
#include "codec/group_quant.h"
#include "codec/spec.h"
#include "codec/sym_quant.h"
#include "common/torch_status.h"

namespace longhaul::codec {
namespace {

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

// The header of a frame of codec `id`, at the codec version the traits table gives it (spec.h).
FrameHeader HeaderFor(const torch::Tensor& x, CodecId id, FrameDtype dtype) {
  FrameHeader h;
  h.codec = id;
  h.codec_version = *FrameVersion(id);  // every id a Codec writes has a row
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
absl::StatusOr<std::string> EncodeFloatFrame(const torch::Tensor& x, CodecId id,
                                             const std::array<uint8_t, kCodecParamBytes>& params, Append&& append) {
  return CatchTorch("encode", [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
    if (!dtype.ok()) return dtype.status();
    const torch::Tensor f = x.to(torch::kCPU, torch::kFloat32).contiguous();
    FrameHeader h = HeaderFor(x, id, *dtype);
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

// fp32 / fp16 / bf16: the payload is the tensor's elements in the row's wire dtype.
class RawCodec : public Codec {
 public:
  RawCodec(CodecSpec spec, const CodecTraits& traits)
      : spec_(std::move(spec)), wire_(TorchType(traits.wire_dtype)) {}
  CodecId id() const override { return spec_.id; }
  std::string spec() const override { return CanonicalSpec(spec_); }

  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions&,
                                     EncodeStats*) const override {
    return CatchTorch("encode", [&]() -> absl::StatusOr<std::string> {
      absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
      if (!dtype.ok()) return dtype.status();
      const torch::Tensor w = x.to(torch::kCPU, wire_).contiguous();
      return BuildFrame(HeaderFor(x, spec_.id, *dtype),
                        absl::string_view(static_cast<const char*>(w.data_ptr()), w.nbytes()));
    });
  }

  absl::StatusOr<FrameParts> EncodeParts(const torch::Tensor& x, const EncodeOptions&,
                                         EncodeStats*) const override {
    return CatchTorch("encode", [&]() -> absl::StatusOr<FrameParts> {
      absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
      if (!dtype.ok()) return dtype.status();
      FrameParts f;
      f.body = x.detach().to(torch::kCPU, wire_).contiguous();  // no copy when x already is
      f.head = BeginFrame(HeaderFor(x, spec_.id, *dtype));
      FinishFrameHead(&f.head, f.body.data_ptr(), f.body.nbytes());
      return f;
    });
  }

 private:
  CodecSpec spec_;
  torch::ScalarType wire_;
};

class GroupQuantCodec : public Codec {
 public:
  explicit GroupQuantCodec(CodecSpec spec) : spec_(std::move(spec)) {}
  CodecId id() const override { return spec_.id; }
  std::string spec() const override { return CanonicalSpec(spec_); }

  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o,
                                     EncodeStats* stats) const override {
    const GroupQuantParams& p = spec_.group_quant;
    return EncodeFloatFrame(x, spec_.id, p.Serialize(),
                            [&](const float* data, const FrameHeader& h, std::string* frame) {
                              int64_t tokens, dim;
                              RowsOf(h.shape, x.numel(), &tokens, &dim);
                              GroupQuantStats gs;
                              absl::Status s = GroupQuantEncode(data, tokens, dim, p, o.threads,
                                                                o.kernels ? *o.kernels : BestKernels(), frame, &gs);
                              if (s.ok() && stats != nullptr) *stats = {gs.groups, gs.transformed_groups, gs.tokens_hi};
                              return s;
                            });
  }

 private:
  CodecSpec spec_;
};

// BitDP's matrix view of a tensor: rows = first dimension (output channels), cols = the rest.
void MatrixOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* rows, int64_t* cols) {
  *rows = shape.empty() ? 1 : shape[0];
  *cols = *rows == 0 ? 0 : numel / *rows;
}

// The symmetric-quant presets (SDP4Bit, ZeRO++) share one wire format; the spec keeps the preset's
// name for spec().
class SymQuantCodec : public Codec {
 public:
  explicit SymQuantCodec(CodecSpec spec) : spec_(std::move(spec)) {}
  CodecId id() const override { return spec_.id; }
  std::string spec() const override { return CanonicalSpec(spec_); }
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o, EncodeStats*) const override {
    const SymQuantParams& p = spec_.sym_quant;
    return EncodeFloatFrame(x, spec_.id, p.Serialize(),
                            [&](const float* data, const FrameHeader&, std::string* frame) {
                              SymQuantEncode(data, x.numel(), p, o.seed, frame, 0,
                                             o.kernels ? *o.kernels : BestKernels());
                              return absl::OkStatus();
                            });
  }

 private:
  CodecSpec spec_;
};

class BitDpCodec : public Codec {
 public:
  explicit BitDpCodec(CodecSpec spec) : spec_(std::move(spec)) {}
  CodecId id() const override { return spec_.id; }
  std::string spec() const override { return CanonicalSpec(spec_); }
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions&, EncodeStats*) const override {
    const int bits = spec_.bitdp_bits;
    std::array<uint8_t, kCodecParamBytes> params{};
    params[0] = static_cast<uint8_t>(bits);
    return EncodeFloatFrame(x, spec_.id, params,
                            [&](const float* data, const FrameHeader& h, std::string* frame) {
                              int64_t rows, cols;
                              MatrixOf(h.shape, x.numel(), &rows, &cols);
                              BitDpEncode(data, rows, cols, bits, frame);
                              return absl::OkStatus();
                            });
  }

 private:
  CodecSpec spec_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(absl::string_view spec) {
  absl::StatusOr<CodecSpec> s = ParseCodecSpec(spec);
  if (!s.ok()) return s.status();
  const CodecTraits& t = *FindCodecTraits(s->name);  // ParseCodecSpec found it
  switch (t.family) {
    case CodecFamily::kRaw: return std::make_unique<RawCodec>(*std::move(s), t);
    case CodecFamily::kGroupQuant: return std::make_unique<GroupQuantCodec>(*std::move(s));
    case CodecFamily::kSymQuant: return std::make_unique<SymQuantCodec>(*std::move(s));
    case CodecFamily::kBitDp: return std::make_unique<BitDpCodec>(*std::move(s));
  }
  return absl::InternalError(absl::StrCat("codec family of \"", spec, "\" has no encoder"));
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
  // The codec id and its version, once for every family: the traits table knows both (spec.h).
  const CodecTraits* traits = CodecTraitsFor(h.codec);
  if (traits == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown codec id ", static_cast<int>(h.codec), " in frame"));
  }
  if (h.codec_version != traits->frame_version) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported ", CodecIdName(h.codec), " version ", h.codec_version));
  }
  absl::StatusOr<torch::Tensor> result = CatchTorch("decode", [&]() -> absl::StatusOr<torch::Tensor> {
    switch (traits->family) {
      case CodecFamily::kRaw: {
        for (uint8_t b : h.params) {
          if (b != 0) return absl::InvalidArgumentError("raw codec frame has non-zero parameters");
        }
        const torch::ScalarType wire = TorchType(traits->wire_dtype);
        const uint64_t elem = static_cast<uint64_t>(traits->wire_bytes);
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
      case CodecFamily::kGroupQuant: {
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
      case CodecFamily::kSymQuant: {
        absl::StatusOr<SymQuantParams> p = SymQuantParams::Parse(h.params);
        if (!p.ok()) return p.status();
        if (absl::Status s = SymQuantValidate(v->payload, v->numel, *p); !s.ok()) return s;
        torch::Tensor t = out_type == torch::kFloat32 ? target(torch::kFloat32)
                                                      : torch::empty(h.shape, torch::kFloat32);
        SymQuantDecode(v->payload, v->numel, *p, {}, t.data_ptr<float>());
        return out_type == torch::kFloat32 ? t : t.to(out_type);
      }
      case CodecFamily::kBitDp: {
        const int bits = h.params[0];
        for (int i = 1; i < kCodecParamBytes; ++i) {
          if (h.params[i] != 0) return absl::InvalidArgumentError("bitdp frame: non-zero reserved parameter bytes");
        }
        int64_t rows, cols;
        MatrixOf(h.shape, v->numel, &rows, &cols);
        if (absl::Status s = BitDpValidate(v->payload, rows, cols, bits); !s.ok()) return s;
        torch::Tensor t = out_type == torch::kFloat32 ? target(torch::kFloat32)
                                                      : torch::empty(h.shape, torch::kFloat32);
        BitDpDecode(v->payload, rows, cols, bits, t.data_ptr<float>());
        return out_type == torch::kFloat32 ? t : t.to(out_type);
      }
    }
    return absl::InternalError(absl::StrCat("codec id ", static_cast<int>(h.codec), " has no decoder"));
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
