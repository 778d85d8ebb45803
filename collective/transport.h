// The point-to-point layer under the replica collectives (collective/group.h): a rank sends a byte
// buffer to a peer rank and receives the next buffer a peer sent it under a tag, both with a
// deadline, and counts what it moved. The algorithms are written once against Transport; two
// implementations exist: in-process (in_process_transport.h, tests and single-process drivers) and
// gRPC (grpc_transport.h, the `longhaul.v1.Collective` service).
//
//   absl::Status s = t->Send(peer, tag, bytes, absl::Now() + absl::Seconds(30));
//   absl::StatusOr<std::string> m = t->Recv(peer, tag, deadline);
//
// Semantics every implementation keeps:
//   - Send returns once the message sits in the peer's Mailbox (not once the peer took it), so a
//     rank may send before it receives without deadlock; the mailbox's byte cap bounds memory and
//     makes a sender wait (up to its deadline) when the peer is far behind.
//   - Messages are matched by (sender, tag); several with the same pair are taken in send order.
//   - Errors name the peer ("rank 2 (10.0.0.7:7100)").
//   - Abort(why) tells every peer, best effort and within about a second, that this rank gave up:
//     their pending and later Recv calls fail with `why`, so one dead rank fails the whole group
//     quickly instead of each rank waiting out its own deadline; this rank's own pending and later
//     Send and Recv calls fail too (a send waiting for a dead peer included). A group is not usable
//     after an abort; the caller builds a new one (a new group id on the gRPC transport).
// Threading: Send/Recv/Abort/counters may be called from any thread; the collectives use one
// thread per rank, and up to three where a step runs parts at the same time (Op::RunConcurrently:
// a bucketed collective's transfers beside its encode and decode, BitDP's fp32 ring beside both).
#ifndef LONGHAUL_COLLECTIVE_TRANSPORT_H_
#define LONGHAUL_COLLECTIVE_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "netem/shaper.h"

namespace longhaul::collective {

// The tag of an abort notice (the payload is the reason's text, at most kMaxAbortBytes).
inline constexpr uint64_t kAbortTag = ~uint64_t{0};
inline constexpr size_t kMaxAbortBytes = 4096;
// Defaults of the hostile-size limits (both transports): the largest message a mailbox accepts and
// the most bytes it buffers for its rank before senders wait. Callers bucket larger tensors.
inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{1} << 30;
inline constexpr int64_t kDefaultMaxBufferedBytes = int64_t{2} << 30;

struct TransportCounters {
  int64_t messages_sent = 0;
  int64_t bytes_sent = 0;       // message payloads handed to the wire
  int64_t wire_bytes_sent = 0;  // payloads plus the transport's framing (chunk headers)
  int64_t messages_received = 0;
  int64_t bytes_received = 0;
  absl::Duration send_time = absl::ZeroDuration();  // inside Send (shaping and back-pressure included)
  absl::Duration recv_wait = absl::ZeroDuration();  // inside Recv, waiting for a message
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "rank 2" plus where it is, for error messages.
  virtual std::string PeerName(int peer) const = 0;
  virtual absl::Status Send(int peer, uint64_t tag, absl::string_view data, absl::Time deadline) = 0;
  virtual absl::StatusOr<std::string> Recv(int peer, uint64_t tag, absl::Time deadline) = 0;
  virtual void Abort(const absl::Status& why) = 0;
  // One line per peer that does not answer by `deadline` (empty when all do): what an error
  // message adds when a Recv timed out, since the peer waited on may itself be waiting on the dead
  // one.
  virtual std::vector<std::string> UnreachablePeers(absl::Time deadline) = 0;
  virtual TransportCounters counters() const = 0;
};

// Inbound messages of one rank, matched by (sender, tag). Shared by both transports: the
// in-process one delivers into the receiver's mailbox directly, the gRPC service after reassembly.
// Thread-safe.
class Mailbox {
 public:
  Mailbox(int rank, int size, int64_t max_message_bytes = kDefaultMaxMessageBytes,
          int64_t max_buffered_bytes = kDefaultMaxBufferedBytes);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t max_message_bytes() const { return max_message_bytes_; }

  // Queues a message from `from`. Refuses a bad sender or an oversized message at once; waits until
  // `deadline` for buffer room (a message always fits into an empty mailbox); fails after Abort.
  absl::Status Deliver(int from, uint64_t tag, std::string data, absl::Time deadline);
  // The oldest message from `from` under `tag`. DeadlineExceeded when none arrives by `deadline`;
  // the poison or abort reason when there is one.
  absl::StatusOr<std::string> Take(int from, uint64_t tag, absl::Time deadline);
  // `from` sent something malformed: its pending and later Take calls fail with `why`.
  void Poison(int from, absl::Status why);
  // Every pending and later Take and Deliver fails with `why` (the first reason sticks).
  void Abort(absl::Status why);
  absl::Status aborted();
  // Sleeps until `until` or until Abort, whichever comes first; the abort reason, or OK.
  absl::Status SleepUnlessAborted(absl::Time until);
  int64_t buffered_bytes();

 private:
  const int rank_, size_;
  const int64_t max_message_bytes_, max_buffered_bytes_;
  absl::Mutex mu_;
  std::map<std::pair<int, uint64_t>, std::deque<std::string>> queues_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> poisoned_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  int64_t buffered_ ABSL_GUARDED_BY(mu_) = 0;
};

// The link shaping of one directed link (netem/shaper.h: rate, delay, jitter, loss), shared by both
// transports so a collective obeys the same emulated links as the pipeline's. A message is admitted
// chunk by chunk at the link's rate; it counts as delivered when its last chunk would arrive, which
// the sender waits for before handing the message over (so a message pays the one-way delay once,
// and back-to-back messages to one peer do not overlap their delays: a collective step waits for
// its messages anyway). Or, on a real link (LinkProfile::paced), the sender's pace: the gRPC
// transport's chunks leave no faster than it (the in-process transport has no network to pace).
// Thread-safe.
class PeerShaper {
 public:
  explicit PeerShaper(const netem::LinkProfile& p);
  bool shaped() const { return shaped_; }
  bool paced() const { return paced_; }
  // A paced link: waits out what earlier chunks owe, then charges `bytes`, which leave now
  // (netem::TokenBucket::Pace). Returns the time waited.
  absl::Duration PaceChunk(int64_t bytes);
  // Paces `bytes` in pieces of `chunk_bytes` and returns when they arrive; DeadlineExceeded (after
  // sleeping until `deadline`) when that is later than `deadline`; the abort reason at once when
  // `abort_on` (if given) is aborted meanwhile.
  absl::Status Pace(int64_t bytes, int64_t chunk_bytes, absl::Time deadline, Mailbox* abort_on = nullptr);
  // For a sender that writes as it paces: admits one chunk, returns its arrival time.
  absl::Time Admit(int64_t bytes);

 private:
  const bool shaped_, paced_;
  absl::Mutex mu_;
  netem::LinkShaper shaper_ ABSL_GUARDED_BY(mu_);
  netem::TokenBucket pacer_ ABSL_GUARDED_BY(mu_);
};

// Sleeps until `t` unless that is after `deadline` (then until `deadline`, returning
// DeadlineExceeded with `what`). With `abort_on`, returns its abort reason as soon as it is aborted.
absl::Status SleepUntil(absl::Time t, absl::Time deadline, absl::string_view what, Mailbox* abort_on = nullptr);

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_TRANSPORT_H_
