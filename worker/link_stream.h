// LinkStream: one bidi-streaming call of raw ByteBuffers on gRPC's public generic callback API
// (grpc::TemplatedGenericStub + grpc::ClientBidiReactor), with a blocking interface for the
// LinkSender's threads: its sender thread writes, its ack reader reads, and Finish collects the
// call's status.
//
//   LinkStream s(channel, StageLinkStreamMethod(), {{kStripeMetadata, "0/1"}});
//   sender thread:  grpc::ByteBuffer c = SerializeChunk(...); if (!s.Write(&c)) break; ...  s.WritesDone();
//   reader thread:  grpc::ByteBuffer m; while (s.Read(&m)) ...
//   owner:          join both; grpc::Status st = s.Finish();
//
// Threading: the reactions (OnWriteDone, OnReadDone, OnDone) run on gRPC's callback threads; they
// record outcomes, wake our threads and start the next queued write, nothing else. Write and
// WritesDone are called by one thread (the writer), Read by one thread (the reader), TryCancel by
// any thread, Finish by the owner once the writer and the reader have stopped.
//
// Writes: gRPC allows one outstanding write per call. Write queues the chunk (up to
// kQueuedWrites behind the one in flight) and returns; the OnWriteDone reaction starts the next
// queued chunk itself, so the stream never idles waiting for our thread to wake up, and the
// writer blocks only while the queue is full. Per chunk that is one wake-up of the writer (the
// hop the reactor API forces, where the synchronous API's writer drove the completion itself),
// off the path from one write to the next. Write takes the ByteBuffer's content by swap:
// neither the payload nor the slice references are copied (the slices reference the frame,
// chunk_wire.h).
//
// The call stays alive (a hold, in reactor terms) until Finish or the destructor releases it, so
// the writer and the reader may call in at any time before that without racing the call's end.
#ifndef LONGHAUL_WORKER_LINK_STREAM_H_
#define LONGHAUL_WORKER_LINK_STREAM_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace longhaul::worker {

class LinkStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts the call to `method` ("/package.Service/Method") on `channel`, sending `metadata` with
  // it. A call that cannot start fails at its first operation (and in Finish).
  LinkStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
             const std::vector<std::pair<std::string, std::string>>& metadata);
  // Cancels the call unless Finish ran, and waits for gRPC to be done with it.
  ~LinkStream() override;
  LinkStream(const LinkStream&) = delete;
  LinkStream& operator=(const LinkStream&) = delete;

  // Chunks that may wait behind the write in flight.
  static constexpr size_t kQueuedWrites = 2;

  // Writer: queues `*msg` (taken, leaving it empty) for sending, blocking while kQueuedWrites are
  // already waiting. False when the call has failed (an earlier write did not go through); nothing
  // is sent then.
  bool Write(grpc::ByteBuffer* msg);
  // Writer: no more writes (half-close), once every queued write completed; false when one failed.
  bool WritesDone();
  // Reader: the next message from the peer; false when the call ended (then do not Read again).
  bool Read(grpc::ByteBuffer* msg);
  // Cancels the call: pending and later operations fail, the peer sees CANCELLED. Any thread.
  void TryCancel() { ctx_.TryCancel(); }
  // Owner, after the writer and the reader stopped: waits for the call to end and returns its
  // status. Once only.
  grpc::Status Finish();

 private:
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;
  // Releases the hold taken at the start (once) and waits for OnDone.
  grpc::Status ReleaseAndWait();

  const std::string method_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;  // the read in flight
  absl::Mutex mu_;
  // The write in flight (gRPC reads it until OnWriteDone): touched by whoever starts a write while
  // writing_ is false, then by OnWriteDone.
  grpc::ByteBuffer out_;
  std::deque<grpc::ByteBuffer> queued_ ABSL_GUARDED_BY(mu_);  // waiting behind out_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a write is in flight
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_STREAM_H_
