// Copy-free wire form of longhaul.v1.TensorFrameChunk (data_plane.proto) for the StageLink stream.
//
// The generated protobuf path copies a chunk's payload three times (into the message's `data`
// string, into gRPC's serialisation buffer, and out of the parsed message on the receiver). The
// data plane instead moves chunks as grpc::ByteBuffer, with the same bytes on the wire:
//
//   send:    protobuf-serialised header fields | tag 8 + varint length | slices over the frame's
//            memory (codec::FrameParts: the head string and, for raw codecs, the tensor itself;
//            the slices hold a reference to the frame; nothing is copied)
//   receive: ParseChunk reads the header fields out of the transport's slices and records where
//            `data` lies; CopyChunkData appends it to the reassembly buffer (the one copy).
//
// The acks (v1::FrameAck) travel as plain protobuf in ByteBuffers (SerializeAck, ParseAck).
//
// ParseChunk accepts any valid TensorFrameChunk encoding (fields in any order, repeated fields with
// the last one winning, unknown fields skipped), so peers using the generated stub interoperate;
// it rejects malformed varints, truncated fields and wrong wire types with a message.
//
//   auto frame = std::make_shared<const codec::FrameParts>(*codec->EncodeParts(t));
//   grpc::ByteBuffer bb = SerializeChunk(header, frame, offset, length);   // header.data() empty
//   ...
//   absl::StatusOr<ParsedChunk> c = ParseChunk(received);
//   AppendChunkData(*c, &reassembly);
#ifndef LONGHAUL_WORKER_CHUNK_WIRE_H_
#define LONGHAUL_WORKER_CHUNK_WIRE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/statusor.h"
#include "codec/frame.h"  // FrameCrc
#include "longhaul/v1/data_plane.pb.h"

// The parsing side needs no LibTorch (so it is fuzzed in the plain-C++ fuzz build, tests/fuzz/);
// only SerializeChunk's definition reads a FrameParts' tensor.
namespace longhaul::codec {
struct FrameParts;
}

namespace longhaul::worker {

// "/longhaul.v1.StageLink/Stream", derived from the generated service so a rename cannot drift.
const char* StageLinkStreamMethod();

// A chunk of `frame` bytes [offset, offset + length) with `header`'s other fields. `header.data()`
// must be empty. The returned buffer keeps `frame` alive until gRPC has sent it.
grpc::ByteBuffer SerializeChunk(const v1::TensorFrameChunk& header,
                                const std::shared_ptr<const codec::FrameParts>& frame, size_t offset,
                                size_t length);

struct ParsedChunk {
  v1::TensorFrameChunk header;        // every field but data
  std::vector<grpc::Slice> slices;    // the message as received (references, not copies)
  size_t data_offset = 0;             // where `data` starts in the concatenated slices
  size_t data_length = 0;
};

// Bounds-checks every field: a hostile message cannot make it read outside the received bytes
// (tests/fuzz/fuzz_chunk_wire.cc). The sizes it reports are the sender's claims: the reassembler
// checks them against the link's limits.
absl::StatusOr<ParsedChunk> ParseChunk(const grpc::ByteBuffer& message);

// Appends the chunk's data to `out` (one copy out of the transport's slices) and, when `crc` is
// given, feeds each piece to it right after copying it, while it is in cache.
void AppendChunkData(const ParsedChunk& c, std::string* out, codec::FrameCrc* crc = nullptr);

// The acks going the other way (v1::FrameAck, a few bytes, only for rejected frames) as the raw
// ByteBuffers of the generic API.
grpc::ByteBuffer SerializeAck(const v1::FrameAck& ack);
absl::StatusOr<v1::FrameAck> ParseAck(grpc::ByteBuffer* message);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_CHUNK_WIRE_H_
