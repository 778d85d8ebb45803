#include "codec/frame.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/byte_io.h"
#include "codec/crc32c.h"

namespace longhaul::codec {

size_t FrameHeaderBytes(int ndim) { return kFrameFixedHeaderBytes + 8 * static_cast<size_t>(ndim); }

const char* CodecIdName(CodecId id) {
  switch (id) {
    case CodecId::kFp32: return "fp32";
    case CodecId::kFp16: return "fp16";
    case CodecId::kBf16: return "bf16";
    case CodecId::kIntK: return "int";
    case CodecId::kTahQuant: return "tahquant";
    case CodecId::kSymQuant: return "symquant";
    case CodecId::kBitDp: return "bitdp";
  }
  return "unknown";
}

std::string BeginFrame(const FrameHeader& h) {
  const int ndim = static_cast<int>(h.shape.size());
  std::string out;
  out.reserve(FrameHeaderBytes(ndim));
  out.append(reinterpret_cast<const char*>(kFrameMagic), 4);
  out.push_back(static_cast<char>(kFrameFormatVersion));
  out.push_back(static_cast<char>(h.codec));
  out.push_back(static_cast<char>(h.codec_version));
  out.push_back(static_cast<char>(h.dtype));
  out.push_back(static_cast<char>(ndim));
  out.append(3, '\0');
  out.append(reinterpret_cast<const char*>(h.params.data()), h.params.size());
  for (int64_t d : h.shape) PutU64(&out, static_cast<uint64_t>(d));
  PutU64(&out, 0);  // payload length, set by FinishFrame
  PutU32(&out, 0);  // CRC32C, set by FinishFrame
  return out;
}

namespace {

void SealHeader(uint8_t* p, const void* payload, uint64_t payload_len) {
  const size_t header_bytes = FrameHeaderBytes(p[8]);
  std::memcpy(p + header_bytes - 12, &payload_len, 8);
  uint32_t crc = Crc32c(p, header_bytes - 4);
  crc = Crc32cExtend(crc, payload, payload_len);
  std::memcpy(p + header_bytes - 4, &crc, 4);
}

}  // namespace

void FinishFrame(std::string* frame) {
  auto* p = reinterpret_cast<uint8_t*>(frame->data());
  const size_t header_bytes = FrameHeaderBytes(p[8]);
  SealHeader(p, p + header_bytes, frame->size() - header_bytes);
}

void FinishFrameHead(std::string* head, const void* payload, size_t payload_len) {
  SealHeader(reinterpret_cast<uint8_t*>(head->data()), payload, payload_len);
}

std::string BuildFrame(FrameHeader h, absl::string_view payload) {
  std::string out = BeginFrame(h);
  out.append(payload.data(), payload.size());
  FinishFrame(&out);
  return out;
}

void FrameCrc::Update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (bad_ || n == 0) return;
  if (header_bytes_ == 0 || seen_ < header_bytes_) {
    // Still in the header: keep its bytes until the CRC field's position is known and reached.
    const size_t want = header_bytes_ ? header_bytes_ : 9;  // ndim is byte 8
    const size_t take = std::min(n, want - seen_);
    std::memcpy(head_ + seen_, p, take);
    seen_ += take, p += take, n -= take;
    if (header_bytes_ == 0 && seen_ == 9) {
      if (head_[8] > kMaxFrameDims) {
        bad_ = true;
        return;
      }
      header_bytes_ = FrameHeaderBytes(head_[8]);
      Update(p, n);
      return;
    }
    if (header_bytes_ == 0 || seen_ < header_bytes_) return;
    crc_ = Crc32c(head_, header_bytes_ - 4);
  }
  crc_ = Crc32cExtend(crc_, p, n);
  seen_ += n;
}

std::optional<uint32_t> FrameCrc::Value() const {
  if (bad_ || header_bytes_ == 0 || seen_ < header_bytes_) return std::nullopt;
  return crc_;
}

absl::StatusOr<FrameView> ParseFrame(absl::string_view f, const DecodeLimits& limits,
                                     std::optional<uint32_t> computed_crc) {
  if (f.size() < kFrameFixedHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame truncated: ", f.size(), " bytes, a header needs at least ",
                     kFrameFixedHeaderBytes));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(f.data());
  if (std::memcmp(p, kFrameMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a tensor frame: bad magic (expected \"LHTF\")");
  }
  if (p[4] != kFrameFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported frame format version ", p[4],
                                                   " (this build reads ", kFrameFormatVersion, ")"));
  }
  FrameView v;
  FrameHeader& h = v.header;
  h.codec = static_cast<CodecId>(p[5]);
  h.codec_version = p[6];
  if (p[7] > static_cast<uint8_t>(FrameDtype::kBFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat("frame has unknown dtype code ", p[7]));
  }
  h.dtype = static_cast<FrameDtype>(p[7]);
  const int ndim = p[8];
  if (ndim > kMaxFrameDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame has ", ndim, " dimensions, at most ", kMaxFrameDims, " allowed"));
  }
  if (p[9] != 0 || p[10] != 0 || p[11] != 0) {
    return absl::InvalidArgumentError("frame header reserved bytes are not zero");
  }
  const size_t header_bytes = FrameHeaderBytes(ndim);
  if (f.size() < header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame truncated: ", f.size(),
                                                   " bytes, its header alone needs ", header_bytes));
  }
  std::memcpy(h.params.data(), p + 12, kCodecParamBytes);
  size_t off = 12 + kCodecParamBytes;
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i, off += 8) {
    const uint64_t d = GetU64(p + off);
    if (d > static_cast<uint64_t>(limits.max_elements)) {
      return absl::InvalidArgumentError(absl::StrCat("frame dimension ", i, " is ", d,
                                                     ", above the limit of ", limits.max_elements,
                                                     " elements"));
    }
    int64_t next;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(d), &next) ||
        next > limits.max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame shape has more than ", limits.max_elements,
                       " elements (limit; see DecodeLimits::max_elements)"));
    }
    numel = next;
    h.shape.push_back(static_cast<int64_t>(d));
  }
  h.payload_len = GetU64(p + off);
  off += 8;
  const uint32_t stored_crc = GetU32(p + off);
  off += 4;
  const size_t available = f.size() - header_bytes;
  if (h.payload_len != available) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame payload length is ", h.payload_len, " bytes but ", available,
                     h.payload_len > available ? " arrived (truncated frame)"
                                               : " arrived (trailing bytes)"));
  }
  uint32_t crc;
  if (computed_crc) {
    crc = *computed_crc;
  } else {
    crc = Crc32c(p, header_bytes - 4);
    crc = Crc32cExtend(crc, p + header_bytes, available);
  }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzers must reach past the checksum
  if (crc != stored_crc) {
    return absl::DataLossError(absl::StrCat("frame CRC32C mismatch: stored ", stored_crc,
                                            ", computed ", crc));
  }
#else
  (void)stored_crc;
#endif
  v.numel = numel;
  v.payload = f.substr(header_bytes);
  return v;
}

}  // namespace longhaul::codec
