// LinkSender: the sending half of one directed link, towards a neighbour's StageLink service
// (link_service.h). The receiving half is that worker's Inbox (inbox.h); GrpcLink pairs them.
//
//   compute thread --Send()--> [bounded queue] --encoder thread: encode + CRC, up to kEncodedAhead
//   frames ahead per stream--> [one queue per stream] --sender thread per stream: chunk, shape or
//   pace, Write--> (delay line, when the link has delay, jitter or loss) --> gRPC stream (LinkStream)
//
// A link may be striped over several gRPC streams (SenderOptions::streams), each on its own
// channel and so its own TCP connection: the encoder deals frame k to stream k % streams and each
// stream has its own sender thread; the receiving Inbox takes frames back in the same turn.
//
// Threading: Send, Finish and Cancel are called by the stage's compute thread only; Abort, stats
// and TakeSendWait from any thread. A LinkSender owns the encoder thread, per stream a sender
// thread and a reader of error acks, and the delay line's thread when the profile has delay,
// jitter or loss (a link shaped in-process has one stream). The gRPC reactions behind each stream
// run on gRPC's threads and only wake ours (link_stream.h). Compute blocks in Send only while the
// send queue is full; it is sized to a step's messages, so in practice never. Any link failure is
// sticky: the link is torn down and the error, naming the peer, reaches the compute thread at its
// next Send or Finish (recovery is the control plane's job).
//
// Device tensors (CUDA) take one of two paths, chosen in Send:
//   - encoded on the device (SenderOptions::codec_device not cpu, the GPU codecs available, and a
//     codec with work to do: every quantising codec, and a raw one whose wire dtype differs from
//     the tensor's): Send queues the device tensor itself (the reference keeps its memory alive)
//     and the encoder thread encodes it there (codec::EncodeOptions::device), so only the frame's
//     bytes cross PCIe. Send makes the link's own CUDA stream wait (an event, on the GPU) for the
//     compute queued so far, which produced the tensor (DeviceCopier::StartDeviceUse), and the
//     encoder runs the codec's kernels on that stream, with it as LibTorch's current stream on
//     the encoder thread: the encode overlaps the stage's next kernels, and its synchronisation
//     waits for the encode only, not for the compute queued after Send. (The encoder thread
//     waits for the link's stream to reach the tensor before it starts the codec, so that
//     LinkStats::encode_seconds counts the encode and not the compute that produced the tensor.)
//   - otherwise Send starts the tensor's copy to pinned host memory on the link's own CUDA stream
//     (a DeviceCopier, device_copy.h), behind the compute stream's work but without waiting for
//     it, and queues the pending HostCopy instead of the tensor; the encoder thread waits for that
//     copy before encoding on the CPU. So the copy overlaps the stage's compute, and compute may
//     drop the device tensor as soon as Send returns (its memory is not reused before the copy
//     has read it).
// Either way, like a CPU tensor, it must not be written in place after Send. CPU tensors are
// queued as they are and encoded on the CPU.
//
// Memory: a frame being sent is shared (std::shared_ptr<const codec::FrameParts>) by the sender
// thread and the gRPC slices of its chunks (chunk_wire.h), and freed by whichever lets go last; an
// fp32 frame's body is the caller's tensor, which must not be written until the frame is on the
// wire (the CRC computed at encode time would catch it).
#ifndef LONGHAUL_WORKER_LINK_SENDER_H_
#define LONGHAUL_WORKER_LINK_SENDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/codec.h"
#include "common/bounded_queue.h"
#include "common/clock.h"
#include "netem/shaper.h"
#include "stage_runtime/link.h"
#include "worker/device_copy.h"
#include "worker/link_stream.h"
#include "worker/link_wire.h"

namespace longhaul::worker {

struct SenderOptions {
  std::string target;  // host:port of the receiving worker
  std::string peer;    // for messages
  // The receiving worker's name: with TLS the handshake checks that the server is that worker
  // (security::DataPlaneChannel). "": any worker of the cluster.
  std::string peer_worker;
  uint64_t job_id = 0;
  int attempt = 0;  // the job's attempt, sent as kAttemptMetadata
  int from_stage = 0;
  int from_replica = 0;  // the sending stage's replica (replicated stages)
  // In-process link emulation (rate, delay, jitter, loss) or pacing; neither by default. Its zero
  // fields mean what netem::LinkProfile says (a burst of about 1 ms of traffic, as tc tbf gets).
  netem::LinkProfile profile;
  size_t queue_capacity = 8;
  int codec_threads = 1;
  // gRPC streams (each on its own TCP connection) the link is striped over, 1..kMaxStripes.
  // Striping lets a fast link (datacenter, loopback) use more cores than one stream's chain of
  // threads; on a rate-limited link it hurts (the flows compete for the bottleneck and the receiver
  // takes frames in turn, so the slower flow sets the pace). A link shaped or paced in-process must use 1
  // (worker::ResolveLinkSpec turns a job spec's links section into these settings).
  int streams = 1;
  // Where the codec runs for tensors on a CUDA device (see the top of this file); kGpu makes Send
  // fail with FailedPrecondition for such a tensor when the GPU codecs are not available.
  codec::CodecDevice codec_device = codec::CodecDevice::kAuto;
  absl::Duration connect_timeout = absl::Seconds(30);
  common::Clock* clock = common::RealClock();
};

// The delay line holds at most this many bytes of chunks waiting for their delivery time (the
// sender thread waits when it is full).
inline constexpr int64_t kMaxDelayLineBytes = int64_t{256} << 20;

class LinkSender {
 public:
  // Connects (waiting up to connect_timeout for the peer) and opens the streams. `codec` must
  // outlive the sender.
  static absl::StatusOr<std::unique_ptr<LinkSender>> Start(const SenderOptions& o,
                                                           const codec::Codec* codec);
  ~LinkSender();

  // Queues a message; the encoder and sender threads encode and send it. Activations and gradients
  // carry a tensor, the norm messages a value and no tensor. `measure_error` also decodes the
  // frame again to measure ||x - dec(enc(x))|| / ||x|| (costs a decode; the caller samples).
  absl::Status Send(stage_runtime::LinkMessage m, bool measure_error);
  // Sends everything queued, closes the streams and waits for the receiver to end them (OK: every
  // frame was accepted).
  absl::Status Finish();
  // Tears the link down now (queued messages are dropped) and joins the threads. Owner thread only.
  void Cancel();
  // Makes the link fail with `why` and cancels the streams, without waiting: wakes a compute thread
  // blocked in Send and a sender blocked in a Write to a hung peer. Any thread.
  void Abort(absl::Status why);

  stage_runtime::LinkStats stats();
  // The gRPC streams (TCP connections) the link is striped over.
  int streams() const { return static_cast<int>(stripes_.size()); }
  // Time Send() spent blocked on a full queue since the last call.
  absl::Duration TakeSendWait();
  // Messages queued by Send and not yet written (the send queue's occupancy, as its capacity counts
  // it). Any thread.
  size_t queue_depth();

 private:
  struct Item {
    stage_runtime::LinkMessage msg;  // msg.tensor is undefined while `copy` holds it
    // A device tensor's copy to the host, started by Send; the encoder waits for it.
    std::optional<HostCopy> copy;
    bool on_device = false;  // msg.tensor is on a CUDA device and is encoded there
    DeviceUse device_use;    // with on_device: the link's stream the encode runs on
    bool measure_error = false;
    bool end = false;  // queued by Finish after the last message
  };
  struct Encoded {
    // Keeps a CPU tensor (an fp32 frame's body) alive; a device tensor is dropped once encoded.
    stage_runtime::LinkMessage msg;
    int64_t elements = 0;  // of the tensor, for the link's raw byte count
    std::shared_ptr<const codec::FrameParts> frame;
    double rel_error = -1;  // measured round-trip error, or -1
    double encode_seconds = 0;  // the codec's encode of the tensor (LinkStats::encode_seconds)
  };
  // Frames encoded ahead of each stream's sender.
  static constexpr size_t kEncodedAhead = 2;

  LinkSender(const SenderOptions& o, const codec::Codec* codec) : opt_(o), codec_(codec) {}
  absl::Status Enqueue(Item item);
  // Whether the CUDA tensor `t` is encoded on its device (see the top of this file); an error for
  // codec_device gpu without the GPU codecs.
  absl::StatusOr<bool> EncodeOnDevice(const torch::Tensor& t) const;
  absl::StatusOr<Encoded> Encode(Item item) const;
  void EncoderLoop();
  void SenderLoop(size_t stripe);
  void AckLoop(size_t stripe);
  void DelayLoop();
  absl::Status WriteFrame(const Encoded& e, size_t stripe);
  // Writes one chunk (taken from *chunk) to stream `stripe`.
  absl::Status Put(grpc::ByteBuffer* chunk, uint64_t step, size_t stripe);
  // Records the link's failure (the first one sticks) and wakes every thread waiting on a queue.
  void Fail(absl::Status s);
  void CancelCalls();

  // One gRPC stream of the link, on its own channel (and so its own TCP connection).
  struct Stripe {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<LinkStream> stream;
    std::thread sender, acker;
  };

  const SenderOptions opt_;
  const codec::Codec* codec_;
  DeviceCopier copier_;  // compute thread only (Send)
  std::vector<std::unique_ptr<Stripe>> stripes_;  // fixed after Start
  // Encoded, not yet written: frame k goes to stream k % stripes_.size(). Closed after the last
  // frame (the end of the link), cancelled when the link fails. Fixed after Start.
  std::vector<std::unique_ptr<common::BoundedQueue<Encoded>>> encoded_;
  std::thread encoder_;
  std::thread delayer_;  // only when the profile has delay, jitter or loss (one stripe then)
  std::unique_ptr<netem::LinkShaper> shaper_;  // sender thread only (one stripe then)
  std::unique_ptr<netem::TokenBucket> pacer_;   // profile.paced(): sender thread only (one stripe then)

  absl::Mutex mu_;
  // Queued by Send, not yet encoded. Not a common::BoundedQueue: its capacity rule also counts
  // in_flight_, which BoundedQueue cannot express.
  std::deque<Item> q_ ABSL_GUARDED_BY(mu_);
  // Items taken from q_ and not yet written (the end marker excluded): they still count against
  // queue_capacity, so compute feels backpressure from the wire, not from the encoder.
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  stage_runtime::LinkStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Duration send_wait_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // The delay line: chunks admitted by the shaper, waiting for their delivery time. Bounded in
  // bytes (kMaxDelayLineBytes), which are released only once on the wire, so it is not a
  // common::BoundedQueue (that counts items).
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

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_SENDER_H_
