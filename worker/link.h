// Data-plane links between neighbouring stages (the StageLink service of data_plane.proto).
//
// One directed link = one LinkSender on the sending worker + one Inbox on the receiving worker:
//
//   compute thread --Send()--> [bounded queue] --sender thread: encode, shape, chunk, Write-->
//   gRPC stream --> StageLinkService handler: reassemble, validate, decode --> [bounded Inbox]
//   --Pop()--> compute thread
//
// Threading: Send/SendValue/Finish/Cancel are called by the stage's compute thread only. Each
// LinkSender owns three threads: the encoder (encode + CRC, up to kEncodedAhead frames ahead),
// the sender (shape, chunk, Write) and the reader of error acks; a fourth, the delay line, when the link
// has delay, jitter or loss. Inbox is a thread-safe bounded
// FIFO between one gRPC handler thread (Push) and the compute thread (Pop). Compute blocks on Send
// only when the send queue is full; queues are sized to a step's frames, so in practice never.
// Any link failure is sticky: the link is torn down and the error, naming the peer, reaches the
// compute thread at its next Send or Pop (STYLE.md 9: recovery is the control plane's job).
#ifndef LONGHAUL_WORKER_LINK_H_
#define LONGHAUL_WORKER_LINK_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/codec.h"
#include "worker/chunk_wire.h"
#include "longhaul/v1/data_plane.grpc.pb.h"
#include "netem/clock.h"
#include "proto/channel_config.h"
#include "netem/shaper.h"

namespace longhaul::worker {

namespace v1 = ::longhaul::v1;

// Largest frame a receiver accepts (a hostile frame_bytes is rejected before any allocation).
inline constexpr int64_t kDefaultMaxFrameBytes = int64_t{1} << 30;
// Chunk size on the wire (below the 4 MiB message limit set on every channel and server).
inline constexpr int64_t kChunkBytes = int64_t{1} << 20;
// A link may be striped over up to this many gRPC streams, each on its own TCP connection: the
// sender deals frame k to stream k % stripes, and the receiving inbox takes them back in turn.
// Each stream announces itself with the call metadata kStripeMetadata = "<index>/<count>".
inline constexpr int kMaxStripes = 8;
inline constexpr char kStripeMetadata[] = "longhaul-stripe";

// A received, validated item: a decoded tensor (FORWARD/BACKWARD) or a scalar (NORM_*).
struct InFrame {
  uint64_t step = 0;
  int micro_batch = 0;
  v1::Direction direction = v1::DIRECTION_UNSPECIFIED;
  torch::Tensor tensor;
  double value = 0;
};

class Inbox {
 public:
  // `peer` describes the sending side for error messages ("stage 1 (worker w1 at host:port)").
  Inbox(size_t capacity, std::string peer);

  // Handler side: the next frame of stream `stripe` (0 when the link is not striped) of the link's
  // SetStripes streams. Blocks while that stream's share of the capacity (capacity / stripes,
  // rounded up) is full. Returns false when the inbox was cancelled (drop the frame).
  bool Push(InFrame f, int stripe = 0);
  // Fixes the link's stripe count (the first stream to arrive sets it); false when a stream
  // announces a different count or an out-of-range one.
  bool SetStripes(int stripes);
  // Compute side: the next frame in the sender's order (streams taken in turn). Fails when the
  // stream that carries it was closed with nothing left (the message names the peer), when
  // cancelled, or after `timeout`.
  absl::StatusOr<InFrame> Pop(absl::Duration timeout);
  // No more frames will come on stream `stripe` (every stream when -1); `why` is reported to a Pop
  // that needs one.
  void Close(absl::Status why, int stripe = -1);
  // Wakes every waiter; Push and Pop fail from now on.
  void Cancel(absl::Status why);
  const std::string& peer() const { return peer_; }

 private:
  const size_t capacity_;
  const std::string peer_;
  absl::Mutex mu_;
  int stripes_ ABSL_GUARDED_BY(mu_) = 1;
  bool stripes_set_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t popped_ ABSL_GUARDED_BY(mu_) = 0;  // frames taken so far: the next comes from stream popped_ % stripes_
  std::deque<InFrame> q_[kMaxStripes] ABSL_GUARDED_BY(mu_);
  absl::Status closed_[kMaxStripes] ABSL_GUARDED_BY(mu_);  // non-OK once that stream closed
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);  // non-OK once cancelled
};

struct LinkStats {
  int64_t frames = 0;
  int64_t raw_bytes = 0;   // fp32 bytes of the tensors sent
  int64_t wire_bytes = 0;  // frame bytes sent (chunk framing excluded)
  int64_t error_samples = 0;
  double sum_rel_error = 0;
  double shaper_wait_seconds = 0;
};

struct SenderOptions {
  std::string target;  // host:port of the receiving worker
  std::string peer;    // for messages
  uint64_t job_id = 0;
  int from_stage = 0;
  // In-process link emulation (rate, delay, jitter, loss); unshaped by default. A zero burst means
  // netem::DefaultBurstBytes (about 1 ms of traffic, as tc tbf gets).
  netem::LinkProfile profile;
  size_t queue_capacity = 8;
  int codec_threads = 1;
  // gRPC streams (each on its own TCP connection) the link is striped over, 1..kMaxStripes (0 is
  // taken as 1). Striping lets a fast link (datacenter, loopback) use more cores than one stream's
  // chain of threads; on a rate-limited link it hurts (the flows compete for the bottleneck and the
  // receiver takes frames in turn, so the slower flow sets the pace). A link shaped in-process
  // always uses 1.
  int streams = 1;
  absl::Duration connect_timeout = absl::Seconds(30);
  netem::Clock* clock = netem::RealClock();
};

class LinkSender {
 public:
  // Connects (waiting up to connect_timeout for the peer) and opens the stream. `codec` must
  // outlive the sender.
  static absl::StatusOr<std::unique_ptr<LinkSender>> Start(const SenderOptions& o,
                                                           const codec::Codec* codec);
  ~LinkSender();

  // Queues a tensor; it is encoded and sent by the sender thread. `measure_error` decodes the
  // frame again to measure ||x - dec(enc(x))|| / ||x|| (costs a decode; the runner samples).
  absl::Status Send(uint64_t step, int micro_batch, v1::Direction dir, torch::Tensor t,
                    bool measure_error);
  absl::Status SendValue(uint64_t step, v1::Direction dir, double value);
  // Sends everything queued, closes the stream and waits for the receiver to end it (OK: every
  // frame was accepted).
  absl::Status Finish();
  // Tears the link down now (queued items are dropped) and joins the threads. Owner thread only.
  void Cancel();
  // Makes the link fail with `why` and cancels the stream, without waiting: wakes a compute thread
  // blocked in Send and a sender blocked in a Write to a hung peer. Any thread.
  void Abort(absl::Status why);

  LinkStats stats();
  // The gRPC streams (TCP connections) the link is striped over.
  int streams() const { return static_cast<int>(stripes_.size()); }
  // Time Send() spent blocked on a full queue since the last call.
  absl::Duration TakeSendWait();

 private:
  struct Item {
    uint64_t step = 0;
    int micro_batch = 0;
    v1::Direction direction = v1::DIRECTION_UNSPECIFIED;
    torch::Tensor tensor;
    double value = 0;
    bool measure_error = false;
    bool end = false;
  };
  LinkSender(const SenderOptions& o, const codec::Codec* codec);
  struct Encoded {
    Item item;
    std::shared_ptr<const codec::FrameParts> frame;  // null for the end marker
    double rel_error = -1;
  };
  static constexpr size_t kEncodedAhead = 2;
  absl::Status Enqueue(Item item);
  absl::StatusOr<Encoded> Encode(Item item) const;
  // Waits until `q` has an item or the link failed; moves the front item to `out`. False when the
  // link failed.
  template <typename T>
  bool TakeFront(std::deque<T>* q, T* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EncoderLoop();
  void SenderLoop(size_t stripe);
  void AckLoop(size_t stripe);
  void DelayLoop();
  absl::Status Put(const grpc::ByteBuffer& chunk, uint64_t step, size_t stripe);
  absl::Status WriteFrame(const Item& item, const std::shared_ptr<const codec::FrameParts>& frame, size_t stripe);
  void Fail(absl::Status s);
  void CancelCalls();

  // One gRPC stream of the link, on its own channel (and so its own TCP connection).
  struct Stripe {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::internal::RpcMethod> method;
    grpc::ClientContext ctx;
    // Chunks go out as ByteBuffers over the frame memory (chunk_wire.h); acks are plain protobuf.
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, v1::FrameAck>> stream;
    std::thread sender, acker;
  };

  const SenderOptions opt_;
  const codec::Codec* codec_;
  std::vector<std::unique_ptr<Stripe>> stripes_;  // fixed after Start
  std::thread encoder_;
  std::thread delayer_;  // only when the profile has delay, jitter or loss (one stripe then)
  std::unique_ptr<netem::LinkShaper> shaper_;  // sender thread only (one stripe then)

  absl::Mutex mu_;
  std::deque<Item> q_ ABSL_GUARDED_BY(mu_);  // queued by Send, not yet encoded
  // Encoded, not yet written: frame k goes to stripe k % stripes_.size().
  std::vector<std::deque<Encoded>> encoded_ ABSL_GUARDED_BY(mu_);
  // Items taken from q_ and not yet written (the end marker excluded): they still count against
  // queue_capacity, so compute feels backpressure from the wire, not from the encoder.
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Duration send_wait_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // The delay line: chunks admitted by the shaper, waiting for their delivery time. Bounded to
  // kMaxDelayLineBytes (the sender waits when it is full).
  struct Delayed {
    grpc::ByteBuffer chunk;
    uint64_t step = 0;
    int64_t bytes = 0;
    absl::Time deliver;
  };
  std::deque<Delayed> line_ ABSL_GUARDED_BY(mu_);
  int64_t line_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool sender_done_ ABSL_GUARDED_BY(mu_) = false;
};

inline constexpr int64_t kMaxDelayLineBytes = int64_t{256} << 20;

// Process-wide malloc settings for a process that moves frames: keeps multi-MiB blocks (gRPC's
// socket read buffers, frames, tensors) in the heap for reuse instead of mmap/munmap per block,
// whose page faults and zeroing cost ~10% of a loopback transfer's CPU. Call once, early in main().
void TuneAllocatorForLargeFrames();

// Where the StageLink handler delivers a link's frames: the worker maps (job, sending stage) to the
// inbox of the stage it hosts. Find may wait up to `wait` for the job to be set up (a neighbour
// can start sending before this worker has processed its own assignment).
class InboxRouter {
 public:
  virtual ~InboxRouter() = default;
  virtual absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int from_stage,
                                                      absl::Duration wait) = 0;
};

// The StageLink service (data_plane.proto). It is registered by hand rather than through the
// generated v1::StageLink::Service so that chunks arrive as raw ByteBuffers and their payload is
// copied once, straight into the reassembly buffer (chunk_wire.h); on the wire it is the same
// service, and clients of the generated stub work unchanged.
class StageLinkService final : public grpc::Service {
 public:
  explicit StageLinkService(InboxRouter* router, int64_t max_frame_bytes = kDefaultMaxFrameBytes);
  grpc::Status Stream(grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::FrameAck, grpc::ByteBuffer>* stream);

 private:
  InboxRouter* router_;
  const int64_t max_frame_bytes_;
  const std::shared_ptr<class FrameBufferPool> buffers_;  // reassembly buffers, shared by streams
};

// Validates a reassembled frame and turns it into an InFrame (decodes tensors, checks that the
// direction may travel on a link from `from_stage`). Takes the frame: fp32 tensors alias its memory
// (codec::DecodeSharedFrame). `frame_crc`: its checksum as computed on arrival (codec::FrameCrc),
// unset to have the decoder compute it. Exposed for tests.
absl::StatusOr<InFrame> DecodeInFrame(const v1::TensorFrameChunk& first, std::shared_ptr<std::string> frame,
                                      std::optional<uint32_t> frame_crc = std::nullopt);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_H_
