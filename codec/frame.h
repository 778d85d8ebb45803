// The tensor frame: the one wire format every codec writes and every decoder validates.
//
// Layout (all integers little-endian, no padding):
//   offset size  field
//   0      4     magic "LHTF"
//   4      1     format version (kFrameFormatVersion)
//   5      1     codec id (CodecId)
//   6      1     codec version (per codec; bumped when its payload layout changes)
//   7      1     dtype of the original tensor (FrameDtype)
//   8      1     ndim (0..kMaxFrameDims)
//   9      3     reserved, must be zero
//   12     16    codec parameters (codec-specific; unused bytes must be zero)
//   28     8*nd  dims (uint64 each)
//   ..     8     payload length in bytes
//   ..     4     CRC32C of every header byte before it and of the payload
//   ..     n     payload
// Header size = 40 + 8 * ndim bytes; it counts toward bits per element in every report.
//
//   FrameHeader h{...};
//   std::string frame = SerializeFrameHeader(h, payload);  frame += payload;   // (see AppendFrame)
//   absl::StatusOr<FrameView> v = ParseFrame(bytes, limits);  // validates everything but the payload
#ifndef LONGHAUL_CODEC_FRAME_H_
#define LONGHAUL_CODEC_FRAME_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul::codec {

inline constexpr uint8_t kFrameMagic[4] = {'L', 'H', 'T', 'F'};
inline constexpr uint8_t kFrameFormatVersion = 1;
inline constexpr int kMaxFrameDims = 8;
inline constexpr int kCodecParamBytes = 16;
inline constexpr size_t kFrameFixedHeaderBytes = 4 + 4 + 4 + kCodecParamBytes + 8 + 4;
static_assert(kFrameFixedHeaderBytes == 40, "frame header layout changed: bump the format version");

// Stable on the wire: never renumber.
enum class CodecId : uint8_t {
  kFp32 = 1,
  kFp16 = 2,
  kBf16 = 3,
  kIntK = 4,      // uniform asymmetric per-group INT-k
  kTahQuant = 5,  // TAH-Quant (same payload layout as kIntK, plus adaptive bits and Hadamard)
  kSymQuant = 6,  // symmetric per-group INT-k, optional fused Hadamard (SDP4Bit, ZeRO++; sym_quant.h)
  kBitDp = 7,     // BitDP 1-/2-bit per output channel (bitdp.h)
};

enum class FrameDtype : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct FrameHeader {
  CodecId codec = CodecId::kFp32;
  uint8_t codec_version = 1;
  FrameDtype dtype = FrameDtype::kFloat32;
  std::vector<int64_t> shape;
  std::array<uint8_t, kCodecParamBytes> params{};
  uint64_t payload_len = 0;
};

// Hard limits a decoder enforces before it allocates anything.
struct DecodeLimits {
  // Largest tensor (in elements) a frame may describe. 2^28 fp32 elements = 1 GiB.
  int64_t max_elements = int64_t{1} << 28;
};

struct FrameView {
  FrameHeader header;
  int64_t numel = 0;
  absl::string_view payload;  // points into the parsed buffer
};

size_t FrameHeaderBytes(int ndim);

// Builds a complete frame (header + payload + CRC) from a header and its payload.
// header.payload_len is set from payload.
std::string BuildFrame(FrameHeader header, absl::string_view payload);

// The same in two steps, for encoders that write the payload in place (no payload copy):
//   std::string f = BeginFrame(h);  <append payload to f>;  FinishFrame(&f);
std::string BeginFrame(const FrameHeader& header);
void FinishFrame(std::string* frame);
// For a frame sent as two pieces: `head` holds BeginFrame's bytes and the payload stays in
// caller memory; sets the payload length and the CRC over both.
void FinishFrameHead(std::string* head, const void* payload, size_t payload_len);

// Validates magic, versions, reserved bytes, ndim, dims (no negative, no overflow, at most
// limits.max_elements), the exact frame length and the CRC. Does not interpret the payload.
// `computed_crc`, when given, is the checksum of exactly these bytes (header without its CRC field,
// then payload) computed as they arrived (FrameCrc); it is compared with the stored CRC instead of
// reading the payload again.
absl::StatusOr<FrameView> ParseFrame(absl::string_view frame, const DecodeLimits& limits,
                                     std::optional<uint32_t> computed_crc = std::nullopt);

// The CRC a frame's header stores, computed over the frame as it arrives in pieces, in order. The
// receive path feeds each piece right after copying it into the reassembly buffer, while it is
// still in cache, so the frame is not read from memory a second time to check it.
//   FrameCrc c;  for (piece : pieces) { append(piece); c.Update(piece); }
//   ParseFrame(frame, limits, c.Value());
class FrameCrc {
 public:
  void Update(const void* data, size_t n);
  // The checksum once the header is complete; nullopt before that, or when the header's ndim is
  // invalid (ParseFrame then checks the frame itself and reports the problem).
  std::optional<uint32_t> Value() const;

 private:
  uint8_t head_[kFrameFixedHeaderBytes + 8 * kMaxFrameDims];
  size_t seen_ = 0;          // bytes of the frame so far
  size_t header_bytes_ = 0;  // 0 until known
  bool bad_ = false;
  uint32_t crc_ = 0;
};

const char* CodecIdName(CodecId id);

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_FRAME_H_
