// The receiving side of a link, independent of gRPC: chunks (chunk_wire.h) are reassembled into
// frames, checked, and decoded into stage_runtime::LinkMessages.
//
//   StageLinkService stream: read + parse header (ParseChunk) --[ChunkQueue]--> assembler thread:
//   Reassembler::Add (the one payload copy, CRC while in cache) --> DecodeInFrame --> Inbox
//
// Memory: a frame's reassembly buffer comes from a FrameBufferPool shared by the service's streams;
// once decoded it belongs to the message (an fp32 tensor aliases it) and returns to the pool when
// the last reference is dropped, from whatever thread drops it.
#ifndef LONGHAUL_WORKER_LINK_RECEIVER_H_
#define LONGHAUL_WORKER_LINK_RECEIVER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/codec.h"
#include "common/bounded_queue.h"
#include "common/peer_host.h"
#include "common/throttled_log.h"
#include "stage_runtime/link.h"
#include "worker/chunk_wire.h"
#include "worker/link_wire.h"

namespace longhaul::worker {

// Reassembly buffers are recycled: a fresh multi-MiB allocation per frame costs page faults and
// zeroing in the kernel (mmap'd by malloc at this size) that showed as ~10% of a loopback
// transfer's CPU time. A buffer returns here when the last tensor aliasing it is freed.
// Thread-safe. Hold it by shared_ptr: buffers handed out keep it alive.
class FrameBufferPool : public std::enable_shared_from_this<FrameBufferPool> {
 public:
  // An empty buffer with at least `capacity` bytes reserved.
  std::shared_ptr<std::string> Get(size_t capacity);

 private:
  static constexpr size_t kMaxFree = 16;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;
  void Put(std::string* s);
  absl::Mutex mu_;
  std::vector<std::unique_ptr<std::string>> free_ ABSL_GUARDED_BY(mu_);
};

// Accumulates the chunks of one frame after another, checking every field against the frame's
// first chunk and the size bounds before anything is allocated or copied. One stream's assembler
// thread owns it.
class Reassembler {
 public:
  Reassembler(int64_t max_frame_bytes, std::shared_ptr<FrameBufferPool> pool)
      : max_(max_frame_bytes), pool_(std::move(pool)) {}

  // Copies the chunk's data in; true when it completed a frame (then first(), TakeBytes() and
  // crc() give it). Any error rejects the stream.
  absl::StatusOr<bool> Add(const ParsedChunk& pc);
  const v1::TensorFrameChunk& first() const { return first_; }
  // The completed frame; the caller takes it (the next frame gets a new buffer).
  std::shared_ptr<std::string> TakeBytes() { return std::move(bytes_); }
  // The completed frame's checksum, computed as its chunks were copied in.
  std::optional<uint32_t> crc() const { return crc_.Value(); }

 private:
  const int64_t max_;
  const std::shared_ptr<FrameBufferPool> pool_;
  uint32_t next_ = 0;  // the chunk index expected next; 0: a new frame
  v1::TensorFrameChunk first_;
  std::shared_ptr<std::string> bytes_;
  codec::FrameCrc crc_;
};

// Time a stage spent decoding its incoming tensor frames (DecodeInFrame adds to it; metrics read
// it), per direction of the frames: forward, the activations from the previous stage; backward,
// the gradients from the next one. A stage has one inbox per direction, so one DecodeTimes shared
// by both keeps each link's figure apart. Host wall time of the decode call: complete for frames
// decoded on the CPU; for frames decoded on a GPU (DecodeTarget::device) it is the upload and the
// kernel launches, the kernels themselves run asynchronously on the stage's stream, ahead of its
// compute, and are not in it. Thread-safe.
class DecodeTimes {
 public:
  void Add(stage_runtime::MessageKind kind, absl::Duration d);
  double seconds(bool forward) const;

 private:
  std::atomic<int64_t> forward_ns_{0}, backward_ns_{0};
};

// Where a link's tensors are decoded to, the receiving stage's choice: no device, the CPU (the
// stage moves them to its device itself); a CUDA device, decoded there from the compressed bytes
// (codec::DecodeOptions::device, on the assembler thread, on the legacy default stream, which is
// the stage's LibTorch default stream, so its compute is ordered after the decode).
struct DecodeTarget {
  std::optional<torch::Device> device = std::nullopt;
  codec::CodecDevice codec_device = codec::CodecDevice::kAuto;
  // Where the decodes are timed; copies of a target share it.
  std::shared_ptr<DecodeTimes> times = std::make_shared<DecodeTimes>();
};

// The target for a stage computing on `stage_device` under links.codec_device `d`: its CUDA device
// when d is not cpu and the GPU codecs are available, else the CPU. (gpu without the GPU codecs is
// refused when the stage is set up, StageRunner.)
DecodeTarget DecodeTargetFor(const torch::Device& stage_device, codec::CodecDevice d);

// Validates a reassembled frame and turns it into a LinkMessage: decodes tensors (activations,
// gradients) and checks norm values (8 bytes, finite, non-negative). Takes the frame: fp32 tensors
// decoded to the CPU alias its memory (codec::DecodeSharedFrame). `frame_crc`: its checksum as
// computed on arrival (codec::FrameCrc), unset to have the decoder compute it.
absl::StatusOr<stage_runtime::LinkMessage> DecodeInFrame(const v1::TensorFrameChunk& first,
                                                         std::shared_ptr<std::string> frame,
                                                         std::optional<uint32_t> frame_crc = std::nullopt,
                                                         const DecodeTarget& target = {});

// Chunks handed from a stream's reader to its assembler thread. Bounded (kChunkQueueCapacity
// chunks of up to kChunkBytes): when the assembler falls behind, the reader stops reading and
// HTTP/2 flow control pushes back on the sender.
struct ReceivedChunk {
  ParsedChunk chunk;
  absl::Status error;  // the reader could not parse a message: the assembler rejects the stream
};
using ChunkQueue = common::BoundedQueue<ReceivedChunk>;
inline constexpr size_t kChunkQueueCapacity = 4;

// The largest frame a link of a job may carry (docs/security.md, "Resource limits"): its largest
// tensor, a [micro_batch_size, context, hidden] activation or gradient, in the largest encoding
// any codec gives it — at most fp32's 4 bytes an element plus per-token and per-group fields, so
// 8 bytes an element bound it — plus the frame header, and at most kDefaultMaxFrameBytes. A stream
// announcing more is refused before anything is allocated (a hostile frame_bytes made the
// receiver reserve up to 1 GiB per stream).
int64_t FrameLimitFor(int64_t micro_batch_size, int64_t context, int64_t hidden);

// Admission of incoming StageLink streams per peer (docs/security.md, "Resource limits"): at most
// `max_per_peer` streams open at once from one peer host (a link has at most kMaxStripes streams,
// a stage a link per neighbour replica it exchanges micro-batches with: two with equal replica
// counts, more where a neighbouring stage has more replicas), and at most `max_waiting` streams,
// of all peers, waiting for a job that is not running here (yet): a neighbour may open its stream
// just before this worker has processed its own assignment, so such a stream waits up to `wait` —
// but a stream naming no job of this worker can then hold a thread only that long, and only
// `max_waiting` of them at once (enough for a fan-in of 16 replicas' streams); the rest are
// refused at once. Each refusal is logged with the peer (the first, then at most every 10 s
// with the count). Thread-safe.
class StreamAdmission {
 public:
  struct Limits {
    int max_per_peer = 32;
    int max_waiting = 16;
    absl::Duration wait = absl::Seconds(5);
  };
  explicit StreamAdmission(Limits limits) : limits_(limits) {}
  StreamAdmission() : StreamAdmission(Limits{}) {}

  // Holds one open stream of a peer until destroyed.
  class Ticket {
   public:
    Ticket(StreamAdmission* a, std::string host) : a_(a), host_(std::move(host)) {}
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    StreamAdmission* const a_;
    const std::string host_;
  };
  // A stream opens from `grpc_peer` ("ipv4:1.2.3.4:5"): a ticket, or RESOURCE_EXHAUSTED naming the
  // limit.
  absl::StatusOr<std::unique_ptr<Ticket>> Open(const std::string& grpc_peer);
  // A stream whose job is not running here asks to wait for it: the time it may wait (then
  // EndWait), or zero when max_waiting streams already wait (refuse it at once).
  absl::Duration BeginWait(const std::string& grpc_peer);
  void EndWait();
  const Limits& limits() const { return limits_; }

  // "ipv4:1.2.3.4:5" -> "1.2.3.4" (common/peer_host.h).
  static std::string PeerHost(const std::string& grpc_peer) { return common::GrpcPeerHost(grpc_peer); }

 private:
  void Refused(const std::string& host, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Limits limits_;
  common::ThrottledLog refusals_{"worker"};
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);  // streams open per peer host
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_RECEIVER_H_
