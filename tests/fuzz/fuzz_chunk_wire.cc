// Fuzz target: the data plane's chunk parser (worker/chunk_wire.h), the first code a hostile peer's
// StageLink message reaches. The input's last byte chooses how the message is cut into slices (as
// gRPC hands a received message over: any number of pieces, empty ones included), the rest is the
// message. ParseChunk must not read outside it; when it accepts the message, the data it locates
// must lie inside it, AppendChunkData must copy exactly that many bytes, and — when protobuf's own
// parser accepts the same bytes — every header field and the data must agree with protobuf's.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "worker/chunk_wire.h"

using longhaul::worker::AppendChunkData;
using longhaul::worker::ParseChunk;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();  // ByteBuffer and Slice use gRPC core's allocator
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t cut = data[size - 1];
  const std::string msg(reinterpret_cast<const char*>(data), size - 1);
  // Slice lengths from the cut byte: 0..7 slices of varying sizes, an empty one where a length is 0.
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (int i = 0; i < (cut & 7) && at < msg.size(); ++i) {
    const size_t n = std::min(msg.size() - at, static_cast<size_t>((cut >> 3) * (i + 1)) % (msg.size() + 1));
    slices.emplace_back(msg.data() + at, n);
    at += n;
  }
  slices.emplace_back(msg.data() + at, msg.size() - at);
  grpc::ByteBuffer bb(slices.data(), slices.size());

  auto parsed = ParseChunk(bb);
  if (!parsed.ok()) return 0;
  if (parsed->data_offset > msg.size() || parsed->data_length > msg.size() - parsed->data_offset) std::abort();
  std::string copied;
  AppendChunkData(*parsed, &copied);
  if (copied.size() != parsed->data_length) std::abort();
  if (copied != msg.substr(parsed->data_offset, parsed->data_length)) std::abort();

  longhaul::v1::TensorFrameChunk ref;
  if (!ref.ParseFromString(msg)) return 0;
  const longhaul::v1::TensorFrameChunk& h = parsed->header;
  if (h.job_id() != ref.job_id() || h.step() != ref.step() || h.micro_batch() != ref.micro_batch() ||
      h.direction() != ref.direction() || h.chunk_index() != ref.chunk_index() ||
      h.chunk_count() != ref.chunk_count() || h.frame_bytes() != ref.frame_bytes() ||
      h.from_stage() != ref.from_stage() || h.from_replica() != ref.from_replica() || copied != ref.data()) {
    std::abort();
  }
  return 0;
}
