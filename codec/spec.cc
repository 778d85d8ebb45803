#include "codec/spec.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace longhaul::codec {
namespace {

// Codec versions (frame.h): bump one when its payload layout changes.
constexpr uint8_t kRawVersion = 1;
constexpr uint8_t kGroupQuantVersion = 1;
constexpr uint8_t kSymQuantVersion = 1;
constexpr uint8_t kBitDpVersion = 1;

// int<k>: the family row's name is kIntPrefix + "<k>", k in [kMinIntBits, kMaxIntBits].
constexpr absl::string_view kIntPrefix = "int";
constexpr int kMinIntBits = 2;
constexpr int kMaxIntBits = 8;

// One constructor per family, so each row below states only what matters for it.
constexpr CodecTraits Raw(const char* name, CodecId id, FrameDtype wire, int bytes, const char* description) {
  return {name, id, kRawVersion, CodecFamily::kRaw, 0, GroupQuantParams{}, SymQuantParams{}, 0, wire, bytes,
          description};
}
constexpr CodecTraits Group(const char* name, CodecId id, uint32_t params, GroupQuantParams defaults,
                            const char* description) {
  return {name, id, kGroupQuantVersion, CodecFamily::kGroupQuant, params, defaults, SymQuantParams{}, 0,
          FrameDtype::kFloat32, 0, description};
}
constexpr CodecTraits Sym(const char* name, uint32_t params, SymQuantParams defaults, const char* description) {
  return {name, CodecId::kSymQuant, kSymQuantVersion, CodecFamily::kSymQuant, params, GroupQuantParams{}, defaults,
          0, FrameDtype::kFloat32, 0, description};
}
constexpr CodecTraits BitDp(const char* name, int bits, const char* description) {
  return {name, CodecId::kBitDp, kBitDpVersion, CodecFamily::kBitDp, 0, GroupQuantParams{}, SymQuantParams{}, bits,
          FrameDtype::kFloat32, 0, description};
}

constexpr uint32_t kTahQuantParams =
    kParamGroup | kParamRatio | kParamTau | kParamBits | kParamHadamard | kParamAdaptive;

// GroupQuantParams: {group_size, bits_hi, bits_lo, ratio, adaptive, hadamard, tau}.
// SymQuantParams: {bits, group_size, hadamard, rounding}.
constexpr CodecTraits kCodecTable[] = {
    Raw("fp32", CodecId::kFp32, FrameDtype::kFloat32, 4, "raw float32, 32 bits per element"),
    Raw("fp16", CodecId::kFp16, FrameDtype::kFloat16, 2, "raw float16, 16 bits per element"),
    Raw("bf16", CodecId::kBf16, FrameDtype::kBFloat16, 2, "raw bfloat16, 16 bits per element"),
    // bits_hi = bits_lo = k come from the name; ratio 1: every token at k bits.
    Group("int<k>", CodecId::kIntK, kParamGroup, {64, 0, 0, 1.0f, false, false, kDefaultTau},
          "k = 2..8: uniform asymmetric INT-k per group of G channels (default 64)"),
    Group("tahquant", CodecId::kTahQuant, kTahQuantParams, {64, 4, 3, 0.8f, true, true, kDefaultTau},
          "TAH-Quant: entropy-ranked adaptive bits, Hadamard on outlier groups; g=64 r=0.8 tau=2 bits=4/3"),
    Sym("sdp4bit-qwd", kParamGroup, {4, 2048, false, Rounding::kNearest},
        "SDP4Bit weight differences: symmetric INT4, g=2048"),
    Sym("sdp4bit-tlqhs", kParamGroup | kParamBits | kParamRounding, {4, 128, true, Rounding::kNearest},
        "SDP4Bit TLq-HS: block-32 Hadamard fused with symmetric INT-B (4 slow level, 8 fast), g=128"),
    Sym("zeropp-ulq", kParamGroup, {4, 128, false, Rounding::kNearest},
        "ZeRO++ qgZ / SDP4Bit ULq: symmetric INT4, g=128, no Hadamard"),
    Sym("zeropp-qw", kParamGroup | kParamBits, {4, 2048, false, Rounding::kNearest},
        "ZeRO++ qwZ / SDP4Bit qW: symmetric INT-B (4 or 8), g=2048"),
    BitDp("bitdp1", 1, "BitDP 1-bit sign per output channel (first dimension), scale = mean |g|"),
    BitDp("bitdp2", 2, "BitDP 2-bit ternary per output channel (first dimension), threshold 0.75 mean |g|"),
};

bool IsIntRow(const CodecTraits& t) { return t.id == CodecId::kIntK; }

absl::Status BadSpec(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad codec spec \"", spec, "\": ", why));
}

// "fp32 fp16 bf16 int2..int8 tahquant ...": every name ParseCodecSpec knows.
std::string KnownNames() {
  std::string s;
  for (const CodecTraits& t : kCodecTable) {
    if (!s.empty()) s += ' ';
    if (IsIntRow(t)) {
      absl::StrAppend(&s, kIntPrefix, kMinIntBits, "..", kIntPrefix, kMaxIntBits);
    } else {
      s += t.name;
    }
  }
  return s;
}

absl::StatusOr<bool> ParseOnOff(absl::string_view v) {
  if (v == "on" || v == "1" || v == "true") return true;
  if (v == "off" || v == "0" || v == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat("expected on/off, got \"", v, "\""));
}

// Applies one KEY=VALUE to *s (the row accepts `key`). Errors are the `why` of BadSpec.
absl::Status ApplyParam(const CodecTraits& t, SpecParam key, absl::string_view k, absl::string_view v,
                        CodecSpec* s) {
  const auto cannot_parse = [&] { return absl::InvalidArgumentError(absl::StrCat("cannot parse value of \"", k, "\"")); };
  GroupQuantParams& g = s->group_quant;
  SymQuantParams& q = s->sym_quant;
  const bool sym = t.family == CodecFamily::kSymQuant;
  switch (key) {
    case kParamGroup:
      if (!absl::SimpleAtoi(v, sym ? &q.group_size : &g.group_size)) return cannot_parse();
      return absl::OkStatus();
    case kParamRatio:
      if (!absl::SimpleAtof(v, &g.ratio)) return cannot_parse();
      return absl::OkStatus();
    case kParamTau:
      if (!absl::SimpleAtof(v, &g.tau)) return cannot_parse();
      return absl::OkStatus();
    case kParamBits:
      if (sym) {
        if (!absl::SimpleAtoi(v, &q.bits) || (q.bits != 4 && q.bits != 8)) {
          return absl::InvalidArgumentError("bits must be 4 or 8");
        }
        return absl::OkStatus();
      } else {
        // H/L, or H alone for one width.
        std::pair<absl::string_view, absl::string_view> hl = absl::StrSplit(v, absl::MaxSplits('/', 1));
        if (!absl::SimpleAtoi(hl.first, &g.bits_hi) ||
            !absl::SimpleAtoi(hl.second.empty() ? hl.first : hl.second, &g.bits_lo)) {
          return cannot_parse();
        }
        return absl::OkStatus();
      }
    case kParamHadamard:
    case kParamAdaptive: {
      absl::StatusOr<bool> b = ParseOnOff(v);
      if (!b.ok()) return b.status();
      (key == kParamHadamard ? g.hadamard : g.adaptive) = *b;
      return absl::OkStatus();
    }
    case kParamRounding:
      if (v != "nearest" && v != "stochastic") return absl::InvalidArgumentError("rounding is nearest or stochastic");
      q.rounding = v == "stochastic" ? Rounding::kStochastic : Rounding::kNearest;
      return absl::OkStatus();
  }
  return absl::InternalError("unhandled spec parameter");
}

// Spec keys in canonical order.
struct ParamName {
  SpecParam param;
  absl::string_view key;
};
constexpr ParamName kParamNames[] = {
    {kParamGroup, "g"},           {kParamRatio, "r"},           {kParamTau, "tau"},
    {kParamBits, "bits"},         {kParamHadamard, "hadamard"}, {kParamAdaptive, "adaptive"},
    {kParamRounding, "rounding"},
};

}  // namespace

absl::Span<const CodecTraits> CodecTable() { return kCodecTable; }

const CodecTraits* FindCodecTraits(absl::string_view name) {
  for (const CodecTraits& t : kCodecTable) {
    if (IsIntRow(t) ? absl::StartsWith(name, kIntPrefix) : name == t.name) return &t;
  }
  return nullptr;
}

const CodecTraits* CodecTraitsFor(CodecId id) {
  for (const CodecTraits& t : kCodecTable) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::optional<uint8_t> FrameVersion(CodecId id) {
  const CodecTraits* t = CodecTraitsFor(id);
  if (t == nullptr) return std::nullopt;
  return t->frame_version;
}

bool operator==(const CodecSpec& a, const CodecSpec& b) {
  if (a.id != b.id || a.name != b.name) return false;
  const GroupQuantParams &g = a.group_quant, &h = b.group_quant;
  const SymQuantParams &p = a.sym_quant, &q = b.sym_quant;
  switch (a.id) {
    case CodecId::kFp32:
    case CodecId::kFp16:
    case CodecId::kBf16:
      return true;
    case CodecId::kIntK:
    case CodecId::kTahQuant:
      return g.group_size == h.group_size && g.bits_hi == h.bits_hi && g.bits_lo == h.bits_lo &&
             g.ratio == h.ratio && g.adaptive == h.adaptive && g.hadamard == h.hadamard && g.tau == h.tau;
    case CodecId::kSymQuant:
      return p.bits == q.bits && p.group_size == q.group_size && p.hadamard == q.hadamard &&
             p.rounding == q.rounding;
    case CodecId::kBitDp:
      return a.bitdp_bits == b.bitdp_bits;
  }
  return false;
}

absl::StatusOr<CodecSpec> ParseCodecSpec(absl::string_view spec) {
  const std::pair<absl::string_view, absl::string_view> nv = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const absl::string_view name = nv.first, params = nv.second;
  const CodecTraits* t = FindCodecTraits(name);
  if (t == nullptr) return BadSpec(spec, absl::StrCat("unknown codec (known: ", KnownNames(), ")"));

  CodecSpec s;
  s.id = t->id;
  s.name = t->name;
  s.group_quant = t->group_quant;
  s.sym_quant = t->sym_quant;
  s.bitdp_bits = t->bitdp_bits;
  if (IsIntRow(*t)) {
    int bits;
    if (!absl::SimpleAtoi(name.substr(kIntPrefix.size()), &bits) || bits < kMinIntBits || bits > kMaxIntBits) {
      return BadSpec(spec, absl::StrCat(t->name, " needs k in ", kMinIntBits, "..", kMaxIntBits));
    }
    s.group_quant.bits_hi = s.group_quant.bits_lo = bits;
    s.name = absl::StrCat(kIntPrefix, bits);  // "int04" -> "int4"
  }

  // "name:" with nothing after the colon is accepted, as "name".
  if (!params.empty()) {
    if (t->params == 0) {
      return BadSpec(spec, t->family == CodecFamily::kRaw ? "raw codecs take no parameters" : "bitdp takes no parameters");
    }
    for (absl::string_view kv : absl::StrSplit(params, ',')) {
      const std::pair<absl::string_view, absl::string_view> f = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      const ParamName* p = nullptr;
      for (const ParamName& n : kParamNames) {
        if (n.key == f.first && (t->params & n.param) != 0) p = &n;
      }
      if (p == nullptr) return BadSpec(spec, absl::StrCat("unknown parameter \"", f.first, "\""));
      if (absl::Status st = ApplyParam(*t, p->param, f.first, f.second, &s); !st.ok()) {
        return BadSpec(spec, st.message());
      }
    }
  }

  absl::Status valid = absl::OkStatus();
  if (t->family == CodecFamily::kGroupQuant) valid = s.group_quant.Validate();
  if (t->family == CodecFamily::kSymQuant) valid = s.sym_quant.Validate();
  if (!valid.ok()) return BadSpec(spec, valid.message());
  return s;
}

std::string CanonicalSpec(const CodecSpec& s) {
  const CodecTraits* t = FindCodecTraits(s.name);
  if (t == nullptr) return s.name;  // not from ParseCodecSpec; nothing better to print
  const GroupQuantParams& g = s.group_quant;
  const SymQuantParams& q = s.sym_quant;
  const bool sym = t->family == CodecFamily::kSymQuant;
  std::string out = s.name;
  char sep = ':';
  for (const ParamName& n : kParamNames) {
    if ((t->params & n.param) == 0) continue;
    absl::StrAppend(&out, absl::string_view(&sep, 1), n.key, "=");
    sep = ',';
    switch (n.param) {
      case kParamGroup: absl::StrAppend(&out, sym ? q.group_size : g.group_size); break;
      case kParamRatio: absl::StrAppend(&out, g.ratio); break;
      case kParamTau: absl::StrAppend(&out, g.tau); break;
      case kParamBits:
        if (sym) {
          absl::StrAppend(&out, q.bits);
        } else {
          absl::StrAppend(&out, g.bits_hi, "/", g.bits_lo);
        }
        break;
      case kParamHadamard: out += g.hadamard ? "on" : "off"; break;
      case kParamAdaptive: out += g.adaptive ? "on" : "off"; break;
      case kParamRounding: out += q.rounding == Rounding::kStochastic ? "stochastic" : "nearest"; break;
    }
  }
  return out;
}

std::string SpecSynopsis(const CodecTraits& t) {
  std::string out = t.name;
  char sep = ':';
  for (const ParamName& n : kParamNames) {
    if ((t.params & n.param) == 0) continue;
    absl::StrAppend(&out, sep == ':' ? "[:" : ",", n.key, "=");
    sep = ',';
    switch (n.param) {
      case kParamGroup: out += "G"; break;
      case kParamRatio: out += "R"; break;
      case kParamTau: out += "T"; break;
      case kParamBits: out += t.family == CodecFamily::kSymQuant ? "4|8" : "H/L"; break;
      case kParamHadamard:
      case kParamAdaptive: out += "on|off"; break;
      case kParamRounding: out += "nearest|stochastic"; break;
    }
  }
  if (sep == ',') out += "]";
  return out;
}

std::string CodecHelp(int indent) {
  std::string out;
  for (const CodecTraits& t : kCodecTable) {
    const std::string syn = SpecSynopsis(t);
    absl::StrAppend(&out, std::string(indent, ' '), syn);
    // Descriptions line up in one column; a synopsis too long for it gets its own line.
    constexpr size_t kColumn = 28;
    if (syn.size() < kColumn) {
      out += std::string(kColumn - syn.size(), ' ');
    } else {
      absl::StrAppend(&out, "\n", std::string(indent + kColumn, ' '));
    }
    absl::StrAppend(&out, t.description, "\n");
  }
  return out;
}

absl::StatusOr<CodecDevice> ParseCodecDevice(absl::string_view name) {
  if (name == "auto") return CodecDevice::kAuto;
  if (name == "cpu") return CodecDevice::kCpu;
  if (name == "gpu") return CodecDevice::kGpu;
  return absl::InvalidArgumentError(absl::StrCat("codec device \"", name, "\" is not auto, cpu or gpu"));
}

const char* CodecDeviceName(CodecDevice d) {
  switch (d) {
    case CodecDevice::kAuto: return "auto";
    case CodecDevice::kCpu: return "cpu";
    case CodecDevice::kGpu: return "gpu";
  }
  return "auto";
}

}  // namespace longhaul::codec
