// Inbox: where one directed link's messages wait for the receiving stage's compute thread.
//
//   StageLinkService stream handler --Push(m, stripe)--> [one BoundedQueue per stream] --Pop()-->
//   compute thread (through GrpcLink::Receive)
//
// A link may be striped over several gRPC streams (link_wire.h, kMaxStripes): the sender deals
// message k to stream k % stripes, so the inbox keeps one queue per stream and Pop takes them back
// in the same turn, which restores the sender's order whatever the streams' relative speeds. Each
// stream may fill its share of the capacity (capacity / stripes, rounded up): that bounds the
// memory a link's frames hold on this side, and a full share stops that stream's handler, whose
// bounded chunk queue then stops reading, so HTTP/2 flow control pushes back on the sender.
//
// Threading: Push is called by the streams' handler threads (one per stream), Pop by the compute
// thread (concurrent Pops are serialised), SetStripes by handler threads, Close and Cancel from any
// thread.
#ifndef LONGHAUL_WORKER_INBOX_H_
#define LONGHAUL_WORKER_INBOX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bounded_queue.h"
#include "stage_runtime/link.h"
#include "worker/link_receiver.h"
#include "worker/link_wire.h"

namespace longhaul::worker {

class Inbox {
 public:
  // `peer` describes the sending side for error messages ("stage 1 (worker w1 at host:port)");
  // `decode` where the link's tensors are decoded to (the receiving stage's choice,
  // link_receiver.h; by default the CPU); `max_frame_bytes` the largest frame a stream of this link
  // may announce (the job's, FrameLimitFor in link_receiver.h): a larger one is refused before its
  // reassembly buffer is allocated.
  Inbox(size_t capacity, std::string peer, DecodeTarget decode = {}, int64_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Fixes the link's stripe count (the first stream to arrive sets it); false when a stream
  // announces a different count or one outside 1..kMaxStripes. A Push before any SetStripes takes
  // the link as unstriped (one stream).
  bool SetStripes(int stripes);
  // Handler side: the next message of stream `stripe` (0 when the link is not striped). Blocks
  // while that stream's share of the capacity is full. Fails (the message is dropped) when the
  // inbox was cancelled, that stream closed, or `stripe` is out of range.
  absl::Status Push(stage_runtime::LinkMessage m, int stripe = 0);
  // Compute side: the next message in the sender's order (streams taken in turn). Fails when the
  // stream that carries it was closed with nothing left (with the reason given to Close), when
  // cancelled, or after `timeout` (the messages name the peer).
  absl::StatusOr<stage_runtime::LinkMessage> Pop(absl::Duration timeout);
  // No more messages will come on stream `stripe` (every stream when -1); `why` (an OK status
  // becomes "link from <peer> closed") is reported to a Pop that needs one. The first reason
  // sticks.
  void Close(absl::Status why, int stripe = -1);
  // Drops what is queued and makes every current and later Push and Pop fail with `why`.
  void Cancel(absl::Status why);
  const std::string& peer() const { return peer_; }
  const DecodeTarget& decode_target() const { return decode_; }
  int64_t max_frame_bytes() const { return max_frame_bytes_; }

 private:
  using Queue = common::BoundedQueue<stage_runtime::LinkMessage>;
  // Creates the per-stream queues for `stripes` streams, applying earlier Close and Cancel calls.
  void CreateQueues(int stripes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const std::string peer_;
  const DecodeTarget decode_;
  const int64_t max_frame_bytes_;
  absl::Mutex mu_;
  int stripes_ ABSL_GUARDED_BY(mu_) = 0;  // 0 until fixed
  // One per stream, created when the stripe count is fixed and never replaced after: a thread
  // that read stripes_ under mu_ may use them without it.
  std::unique_ptr<Queue> queues_[kMaxStripes] ABSL_GUARDED_BY(mu_);
  absl::Status closed_[kMaxStripes] ABSL_GUARDED_BY(mu_);  // non-OK once that stream closed
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);  // non-OK once cancelled
  // Serialises Pop; popped_ counts the messages taken so far: the next comes from stream
  // popped_ % stripes_.
  absl::Mutex pop_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t popped_ ABSL_GUARDED_BY(pop_mu_) = 0;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_INBOX_H_
