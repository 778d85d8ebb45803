#include "worker/chunk_wire.h"

#include <algorithm>
#include <cstring>

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "longhaul/v1/data_plane.grpc.pb.h"
#ifndef LONGHAUL_CHUNK_WIRE_PARSE_ONLY
#include "codec/codec.h"  // FrameParts (LibTorch), for SerializeChunk only
#endif

namespace longhaul::worker {
namespace {

constexpr uint32_t kDataField = 8;  // TensorFrameChunk.data
constexpr int kWireVarint = 0, kWireFixed64 = 1, kWireLengthDelimited = 2, kWireFixed32 = 5;

#ifndef LONGHAUL_CHUNK_WIRE_PARSE_ONLY
void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void ReleaseFrame(void* p) { delete static_cast<std::shared_ptr<const codec::FrameParts>*>(p); }
#endif

// Sequential reader over the received slices; every read is bounds-checked.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& s) : s_(s) {
    for (const grpc::Slice& x : s_) total_ += x.size();
  }
  size_t position() const { return pos_; }
  bool done() const { return pos_ >= total_; }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return absl::InvalidArgumentError("chunk message truncated inside a varint");
      const uint8_t b = Byte();
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return absl::InvalidArgumentError("chunk message has a varint longer than 10 bytes");
  }

  absl::Status Skip(uint64_t n) {
    if (n > total_ - pos_) {
      return absl::InvalidArgumentError(absl::StrCat("chunk message truncated: a field of ", n, " bytes with ",
                                                     total_ - pos_, " left"));
    }
    pos_ += n;
    while (slice_ < s_.size() && pos_ >= slice_start_ + s_[slice_].size()) {
      slice_start_ += s_[slice_].size();
      ++slice_;
    }
    return absl::OkStatus();
  }

 private:
  uint8_t Byte() {
    while (pos_ - slice_start_ >= s_[slice_].size()) {  // skip empty slices
      slice_start_ += s_[slice_].size();
      ++slice_;
    }
    const uint8_t b = s_[slice_].begin()[pos_ - slice_start_];
    ++pos_;
    return b;
  }

  const std::vector<grpc::Slice>& s_;
  size_t total_ = 0;
  size_t pos_ = 0;
  size_t slice_ = 0;        // the slice holding pos_
  size_t slice_start_ = 0;  // offset of that slice
};

}  // namespace

const char* StageLinkStreamMethod() {
  static const std::string* const name = new std::string(absl::StrCat("/", v1::StageLink::service_full_name(), "/Stream"));
  return name->c_str();
}

// The fuzz build (tests/fuzz/clang_build) compiles this file without LibTorch: everything but
// the sending side.
#ifndef LONGHAUL_CHUNK_WIRE_PARSE_ONLY
grpc::ByteBuffer SerializeChunk(const v1::TensorFrameChunk& header,
                                const std::shared_ptr<const codec::FrameParts>& frame, size_t offset,
                                size_t length) {
  std::string head = header.SerializeAsString();
  PutVarint(uint64_t{kDataField} << 3 | kWireLengthDelimited, &head);
  PutVarint(length, &head);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head);
  // The frame is frame->head followed by frame->body; the chunk may cover parts of both.
  struct Piece {
    const char* data;
    size_t size;
  };
  const Piece pieces[2] = {
      {frame->head.data(), frame->head.size()},
      {frame->body.defined() ? static_cast<const char*>(frame->body.data_ptr()) : nullptr,
       frame->body.defined() ? frame->body.nbytes() : 0},
  };
  size_t start = 0;  // of the current piece within the frame
  for (const Piece& p : pieces) {
    const size_t lo = std::max(offset, start), hi = std::min(offset + length, start + p.size);
    if (lo < hi) {
      slices.emplace_back(const_cast<char*>(p.data + (lo - start)), hi - lo, &ReleaseFrame,
                          new std::shared_ptr<const codec::FrameParts>(frame));
    }
    start += p.size;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}
#endif  // LONGHAUL_CHUNK_WIRE_PARSE_ONLY

absl::StatusOr<ParsedChunk> ParseChunk(const grpc::ByteBuffer& message) {
  ParsedChunk c;
  if (grpc::Status s = message.Dump(&c.slices); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot read a received chunk: ", s.error_message()));
  }
  SliceCursor in(c.slices);
  v1::TensorFrameChunk& h = c.header;
  while (!in.done()) {
    absl::StatusOr<uint64_t> tag = in.Varint();
    if (!tag.ok()) return tag.status();
    const uint64_t field = *tag >> 3;
    const int wire = static_cast<int>(*tag & 7);
    if (field == 0 || field > 0x1FFFFFFF) {
      return absl::InvalidArgumentError(absl::StrCat("chunk message has invalid field number ", field));
    }
    if (wire == kWireVarint) {
      absl::StatusOr<uint64_t> v = in.Varint();
      if (!v.ok()) return v.status();
      // Same truncation as protobuf's own parser for 32-bit fields.
      switch (field) {
        case 1: h.set_job_id(*v); break;
        case 2: h.set_step(*v); break;
        case 3: h.set_micro_batch(static_cast<uint32_t>(*v)); break;
        case 4: h.set_direction(static_cast<v1::Direction>(static_cast<int32_t>(*v))); break;
        case 5: h.set_chunk_index(static_cast<uint32_t>(*v)); break;
        case 6: h.set_chunk_count(static_cast<uint32_t>(*v)); break;
        case 7: h.set_frame_bytes(*v); break;
        case 9: h.set_from_stage(static_cast<int32_t>(*v)); break;
        case 10: h.set_from_replica(static_cast<int32_t>(*v)); break;
        default: break;  // unknown field
      }
    } else if (wire == kWireLengthDelimited) {
      absl::StatusOr<uint64_t> n = in.Varint();
      if (!n.ok()) return n.status();
      const size_t at = in.position();
      if (absl::Status s = in.Skip(*n); !s.ok()) return s;
      if (field == kDataField) {  // a repeated singular field: the last one wins
        c.data_offset = at;
        c.data_length = static_cast<size_t>(*n);
      }
    } else if (wire == kWireFixed64 || wire == kWireFixed32) {
      if (absl::Status s = in.Skip(wire == kWireFixed64 ? 8 : 4); !s.ok()) return s;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("chunk message field ", field, " has unsupported wire type ", wire));
    }
  }
  return c;
}

void AppendChunkData(const ParsedChunk& c, std::string* out, codec::FrameCrc* crc) {
  size_t skip = c.data_offset, left = c.data_length;
  for (const grpc::Slice& s : c.slices) {
    if (left == 0) break;
    if (skip >= s.size()) {
      skip -= s.size();
      continue;
    }
    const size_t n = std::min(left, s.size() - skip);
    const char* piece = reinterpret_cast<const char*>(s.begin()) + skip;
    out->append(piece, n);
    if (crc != nullptr) crc->Update(piece, n);
    left -= n;
    skip = 0;
  }
}

grpc::ByteBuffer SerializeAck(const v1::FrameAck& ack) {
  grpc::Slice s(ack.SerializeAsString());
  return grpc::ByteBuffer(&s, 1);
}

absl::StatusOr<v1::FrameAck> ParseAck(grpc::ByteBuffer* message) {
  v1::FrameAck ack;
  if (!message->Valid()) return ack;  // an empty message: every field at its default
  grpc::ProtoBufferReader reader(message);
  if (!reader.status().ok() || !ack.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat("unreadable FrameAck of ", message->Length(), " bytes"));
  }
  return ack;
}

}  // namespace longhaul::worker
