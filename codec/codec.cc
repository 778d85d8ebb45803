#include "codec/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/bitdp.h"
#include "codec/codec_gpu.h"
#include "codec/group_quant.h"
#include "codec/spec.h"
#include "codec/sym_quant.h"
#include "common/torch_status.h"

namespace longhaul::codec {

namespace internal {

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

std::array<uint8_t, kCodecParamBytes> FrameParams(const CodecSpec& spec) {
  std::array<uint8_t, kCodecParamBytes> params{};
  switch (CodecTraitsFor(spec.id)->family) {  // every id a spec names has a row
    case CodecFamily::kRaw: break;
    case CodecFamily::kGroupQuant: return spec.group_quant.Serialize();
    case CodecFamily::kSymQuant: return spec.sym_quant.Serialize();
    case CodecFamily::kBitDp: params[0] = static_cast<uint8_t>(spec.bitdp_bits); break;
  }
  return params;
}

void RowsOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* tokens, int64_t* dim) {
  *dim = shape.empty() ? 1 : shape.back();
  *tokens = *dim == 0 ? 0 : numel / *dim;
}

void MatrixOf(const std::vector<int64_t>& shape, int64_t numel, int64_t* rows, int64_t* cols) {
  *rows = shape.empty() ? 1 : shape[0];
  *cols = *rows == 0 ? 0 : numel / *rows;
}

absl::StatusOr<ValidatedPayload> ValidatePayload(const FrameView& v) {
  const FrameHeader& h = v.header;
  ValidatedPayload p;
  p.family = CodecTraitsFor(h.codec)->family;  // the caller checked the id
  p.payload = v.payload;
  p.numel = v.numel;
  switch (p.family) {
    case CodecFamily::kGroupQuant: {
      absl::StatusOr<GroupQuantParams> gp = GroupQuantParams::Parse(h.params);
      if (!gp.ok()) return gp.status();
      p.group_quant = *gp;
      RowsOf(h.shape, v.numel, &p.tokens, &p.dim);
      absl::StatusOr<GroupQuantLayout> layout = GroupQuantValidate(v.payload, p.tokens, p.dim, p.group_quant);
      if (!layout.ok()) return layout.status();
      p.layout = *std::move(layout);
      return p;
    }
    case CodecFamily::kSymQuant: {
      absl::StatusOr<SymQuantParams> sp = SymQuantParams::Parse(h.params);
      if (!sp.ok()) return sp.status();
      p.sym_quant = *sp;
      if (absl::Status st = SymQuantValidate(v.payload, v.numel, p.sym_quant); !st.ok()) return st;
      return p;
    }
    case CodecFamily::kBitDp: {
      p.bitdp_bits = h.params[0];
      for (int i = 1; i < kCodecParamBytes; ++i) {
        if (h.params[i] != 0) return absl::InvalidArgumentError("bitdp frame: non-zero reserved parameter bytes");
      }
      MatrixOf(h.shape, v.numel, &p.rows, &p.cols);
      if (absl::Status st = BitDpValidate(v.payload, p.rows, p.cols, p.bitdp_bits); !st.ok()) return st;
      return p;
    }
    case CodecFamily::kRaw: break;
  }
  return absl::InternalError("a raw frame has no payload to validate");
}

void DecodeValidated(const ValidatedPayload& p, int threads, const Kernels& k, float* out) {
  switch (p.family) {
    case CodecFamily::kGroupQuant:
      GroupQuantDecode(p.payload, p.layout, p.tokens, p.dim, p.group_quant, threads, k, out);
      return;
    case CodecFamily::kSymQuant: SymQuantDecode(p.payload, p.numel, p.sym_quant, {}, out, k); return;
    case CodecFamily::kBitDp: BitDpDecode(p.payload, p.rows, p.cols, p.bitdp_bits, out); return;
    case CodecFamily::kRaw: return;
  }
}

}  // namespace internal

namespace {

using internal::DtypeOf;
using internal::FrameParams;
using internal::HeaderFor;
using internal::MatrixOf;
using internal::RowsOf;
using internal::TorchType;

// The encode path every quantising codec shares. A CUDA tensor goes to the GPU path unless
// options say otherwise (EncodeOptions::device); else: a float32 CPU view of x, the frame header
// with the codec's parameters, the payload appended in place by `append(data, header, frame)`, the
// CRC.
template <typename Append>
absl::StatusOr<std::string> EncodeFloatFrame(const torch::Tensor& x, const CodecSpec& spec, const EncodeOptions& o,
                                             EncodeStats* stats, Append&& append) {
  return CatchTorch("encode", [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<bool> gpu = internal::UseGpuEncode(x, o.device);
    if (!gpu.ok()) return gpu.status();
    if (*gpu) return internal::EncodeFrameOnGpu(spec, x, o, stats);
    const torch::Tensor f = x.to(torch::kCPU, torch::kFloat32).contiguous();
    FrameHeader h = HeaderFor(x, spec.id, *dtype);
    h.params = FrameParams(spec);
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

  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o,
                                     EncodeStats* stats) const override {
    absl::StatusOr<FrameParts> f = EncodeParts(x, o, stats);
    if (!f.ok()) return f.status();
    return f->Join();
  }

  absl::StatusOr<FrameParts> EncodeParts(const torch::Tensor& x, const EncodeOptions& o,
                                         EncodeStats*) const override {
    return CatchTorch("encode", [&]() -> absl::StatusOr<FrameParts> {
      absl::StatusOr<FrameDtype> dtype = DtypeOf(x);
      if (!dtype.ok()) return dtype.status();
      absl::StatusOr<bool> gpu = internal::UseGpuEncode(x, o.device);
      if (!gpu.ok()) return gpu.status();
      FrameParts f;
      if (*gpu) {  // cast on the device: only the wire dtype's bytes cross PCIe
        absl::StatusOr<torch::Tensor> body = internal::RawBodyOnGpu(x, wire_, o.cuda_stream);
        if (!body.ok()) return body.status();
        f.body = *std::move(body);
      } else {
        f.body = x.detach().to(torch::kCPU, wire_).contiguous();  // no copy when x already is
      }
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
    return EncodeFloatFrame(x, spec_, o, stats,
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

// The symmetric-quant presets (SDP4Bit, ZeRO++) share one wire format; the spec keeps the preset's
// name for spec().
class SymQuantCodec : public Codec {
 public:
  explicit SymQuantCodec(CodecSpec spec) : spec_(std::move(spec)) {}
  CodecId id() const override { return spec_.id; }
  std::string spec() const override { return CanonicalSpec(spec_); }
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o,
                                     EncodeStats* stats) const override {
    const SymQuantParams& p = spec_.sym_quant;
    return EncodeFloatFrame(x, spec_, o, stats,
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
  absl::StatusOr<std::string> Encode(const torch::Tensor& x, const EncodeOptions& o,
                                     EncodeStats* stats) const override {
    const int bits = spec_.bitdp_bits;
    return EncodeFloatFrame(x, spec_, o, stats,
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
  // The codec id and its version, once for every family: the traits table knows both (spec.h).
  const CodecTraits* traits = CodecTraitsFor(h.codec);
  if (traits == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown codec id ", static_cast<int>(h.codec), " in frame"));
  }
  if (h.codec_version != traits->frame_version) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported ", CodecIdName(h.codec), " version ", h.codec_version));
  }
  // Where the result goes (DecodeOptions::device) and whether the GPU decodes it.
  const bool to_device = o.device.has_value() && !o.device->is_cpu();
  absl::StatusOr<bool> gpu = internal::UseGpuDecode(o.device, o.codec_device);
  if (!gpu.ok()) return gpu.status();
  // Reuse *out when it already has the right shape and type and the result stays on the CPU;
  // called only after validation.
  auto target = [&](torch::ScalarType type) {
    if (!to_device && out->defined() && out->device().is_cpu() && out->scalar_type() == type &&
        out->is_contiguous() && out->sizes() == torch::IntArrayRef(h.shape)) {
      return *out;
    }
    return torch::empty(h.shape, torch::TensorOptions().dtype(type));
  };
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
        if (*gpu) return internal::UploadRaw(v->payload, h.shape, wire, out_type, *o.device);
        const auto* payload = v->payload.data();
        if (wire == out_type && owner != nullptr && !to_device && v->numel > 0 &&
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
      case CodecFamily::kGroupQuant:
      case CodecFamily::kSymQuant:
      case CodecFamily::kBitDp: {
        // Validated once on the host; decoded into fp32 on the CPU or on the device, then cast to
        // the frame's dtype there.
        absl::StatusOr<internal::ValidatedPayload> p = internal::ValidatePayload(*v);
        if (!p.ok()) return p.status();
        if (*gpu) return internal::DecodeOnGpu(*p, h.shape, out_type, *o.device, o.cuda_stream);
        torch::Tensor t = out_type == torch::kFloat32 ? target(torch::kFloat32) : torch::empty(h.shape, torch::kFloat32);
        internal::DecodeValidated(*p, o.threads, o.kernels ? *o.kernels : BestKernels(), t.data_ptr<float>());
        return out_type == torch::kFloat32 ? t : t.to(out_type);
      }
    }
    return absl::InternalError(absl::StrCat("codec id ", static_cast<int>(h.codec), " has no decoder"));
  });
  if (!result.ok()) return result.status();
  // Decoded on the CPU for a device: one copy of the decoded tensor (kAuto without the GPU codecs,
  // or kCpu).
  if (to_device && !*gpu) {
    absl::StatusOr<torch::Tensor> moved = CatchTorch("decode", [&]() -> absl::StatusOr<torch::Tensor> {
      return result->to(*o.device);
    });
    if (!moved.ok()) return moved.status();
    result = std::move(moved);
  }
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
