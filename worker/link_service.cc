#include "worker/link_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "longhaul/v1/data_plane.pb.h"
#include "security/tls.h"
#include "worker/chunk_wire.h"

namespace longhaul::worker {
namespace {

// Streams per peer and streams waiting for a job (link_receiver.h): one admission per process,
// as a worker serves one StageLink service.
StreamAdmission& LinkAdmission() {
  static StreamAdmission* const admission = new StreamAdmission();
  return *admission;
}

// Ends a call at once with `status` (an unknown method, bad call metadata).
class RejectedCall final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RejectedCall(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// Which stream of a striped link a call is, from its kStripeMetadata ("<index>/<count>"; absent:
// 0 of 1).
absl::StatusOr<std::pair<int, int>> StripeOf(const grpc::GenericCallbackServerContext& ctx) {
  const auto m = ctx.client_metadata().find(kStripeMetadata);
  if (m == ctx.client_metadata().end()) return std::make_pair(0, 1);
  const std::string v(m->second.data(), m->second.size());
  const std::vector<std::string> parts = absl::StrSplit(v, '/');
  int stripe = 0, stripes = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &stripe) || !absl::SimpleAtoi(parts[1], &stripes) ||
      stripes < 1 || stripes > kMaxStripes || stripe < 0 || stripe >= stripes) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", kStripeMetadata, " metadata \"", v,
                                                   "\" (want <index>/<count>, count <= ", kMaxStripes, ")"));
  }
  return std::make_pair(stripe, stripes);
}

// The job attempt a call is for, from its kAttemptMetadata (absent: 0).
absl::StatusOr<int> AttemptOf(const grpc::GenericCallbackServerContext& ctx) {
  const auto m = ctx.client_metadata().find(kAttemptMetadata);
  if (m == ctx.client_metadata().end()) return 0;
  const std::string v(m->second.data(), m->second.size());
  int attempt = 0;
  if (!absl::SimpleAtoi(v, &attempt) || attempt < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", kAttemptMetadata, " metadata \"", v, "\""));
  }
  return attempt;
}

}  // namespace

// One incoming StageLink stream (see link_service.h for its threads). Deletes itself in OnDone.
class StageLinkService::Stream final : public grpc::ServerGenericBidiReactor {
 public:
  Stream(grpc::GenericCallbackServerContext* ctx, const StageLinkService* svc, int stripe, int stripes, int attempt)
      : ctx_(ctx), svc_(svc), stripe_(stripe), stripes_(stripes), attempt_(attempt), chunks_(kChunkQueueCapacity) {
    StartRead(&in_);  // held back by gRPC until the reactor is bound
    assembler_ = std::thread([this] {
      started_.WaitForNotification();  // assembler_ is assigned before anything can reach OnDone
      Run();
    });
    started_.Notify();
  }

  // This stream's place among its peer's (StreamAdmission), set by CreateReactor; released with it.
  std::unique_ptr<StreamAdmission::Ticket> ticket;

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, cancelled or went away
      chunks_.Close(absl::OutOfRangeError("end of stream"));
      return;
    }
    absl::StatusOr<ParsedChunk> c = ParseChunk(in_);
    if (!c.ok()) {
      // The assembler rejects the stream; nothing more is read.
      chunks_.Push({ParsedChunk(), c.status()}).IgnoreError();
      chunks_.Close(absl::OutOfRangeError("unreadable message"));
      return;
    }
    // Never blocks: a read is started only while the queue has room, and only this reaction pushes.
    if (!chunks_.Push({*std::move(c), absl::OkStatus()}).ok()) return;  // the assembler stopped
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    // StartRead never runs a reaction on this thread (gRPC dispatches them), so it may be called
    // under mu_, which keeps it from racing the assembler's Finish.
    if (chunks_.size() < chunks_.capacity()) {
      StartRead(&in_);
    } else {
      paused_ = true;
    }
  }

  void OnDone() override {
    // OnDone follows Finish, the assembler's last call: it is exiting or gone. gRPC runs reactions
    // on its own threads; the detach is only a guard.
    if (assembler_.get_id() == std::this_thread::get_id()) {
      assembler_.detach();
    } else {
      assembler_.join();
    }
    delete this;
  }

 private:
  // The assembler thread: serves the stream, then finishes the call (the last use of ctx_).
  void Run() {
    grpc::Status st = Serve();
    {
      absl::MutexLock l(&mu_);
      stopped_ = true;  // no more reads are started
    }
    chunks_.Cancel(absl::CancelledError("stream over"));
    if (reject_ack_) {
      StartWriteAndFinish(&*reject_ack_, grpc::WriteOptions(), st);
    } else {
      Finish(st);
    }
  }

  // The inbox of the stream's job. A job not running here may be about to (a neighbour can send
  // before this worker processed its own assignment): the stream waits for it, but only briefly
  // and only while few others wait (StreamAdmission, docs/security.md), else it is refused at once.
  absl::StatusOr<std::shared_ptr<Inbox>> FindInbox(const v1::TensorFrameChunk& h) {
    absl::StatusOr<std::shared_ptr<Inbox>> found =
        svc_->router_->Find(h.job_id(), attempt_, h.from_stage(), h.from_replica(), absl::ZeroDuration());
    if (found.ok() || !absl::IsFailedPrecondition(found.status())) return found;
    const absl::Duration wait = LinkAdmission().BeginWait(ctx_->peer());
    if (wait == absl::ZeroDuration()) return found;
    found = svc_->router_->Find(h.job_id(), attempt_, h.from_stage(), h.from_replica(), wait);
    LinkAdmission().EndWait();
    return found;
  }

  // The next chunk, or the end of the stream (a non-OK status).
  absl::StatusOr<ReceivedChunk> Next() {
    absl::StatusOr<ReceivedChunk> c = chunks_.Pop();
    absl::MutexLock l(&mu_);
    if (paused_ && !stopped_) {  // the chunk taken made room
      paused_ = false;
      StartRead(&in_);
    }
    return c;
  }

  grpc::Status Serve() {
    absl::StatusOr<ReceivedChunk> first = Next();
    if (!first.ok()) return grpc::Status::OK;  // nothing was sent
    if (!first->error.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(first->error.message()));
    const v1::TensorFrameChunk& h = first->chunk.header;
    absl::StatusOr<std::shared_ptr<Inbox>> found = FindInbox(h);
    if (!found.ok()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(found.status().message()));
    }
    // mTLS: only the neighbour the coordinator assigned may feed this stage (any other certificate
    // of the cluster is refused before its frames touch the inbox).
    if (std::optional<security::Identity> who = security::PeerIdentity(*ctx_->auth_context())) {
      if (absl::Status s = svc_->router_->CheckSender(h.job_id(), h.from_stage(), h.from_replica(), who->name);
          !s.ok()) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(s.message()));
      }
    }
    const std::shared_ptr<Inbox> inbox = *std::move(found);
    if (!inbox->SetStripes(stripes_)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("stream ", stripe_, "/", stripes_, " does not match the link's stripe count"));
    }
    // The job's own frame limit (link_receiver.h, FrameLimitFor), below the service's.
    Reassembler r(std::min(svc_->max_frame_bytes_, inbox->max_frame_bytes()), svc_->buffers_);
    v1::TensorFrameChunk last;  // the last chunk that parsed, named in a rejection
    auto reject = [&](const absl::Status& s) {
      v1::FrameAck ack;
      ack.set_step(last.step());
      ack.set_micro_batch(last.micro_batch());
      ack.set_direction(last.direction());
      ack.set_error(std::string(s.message()));
      reject_ack_ = SerializeAck(ack);
      inbox->Close(absl::DataLossError(absl::StrCat("bad frame from ", inbox->peer(), ": ", s.message())));
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
    };
    for (absl::StatusOr<ReceivedChunk> it = std::move(first); it.ok(); it = Next()) {
      if (!it->error.ok()) return reject(it->error);
      last = it->chunk.header;
      absl::StatusOr<bool> done = r.Add(it->chunk);
      if (!done.ok()) return reject(done.status());
      if (!*done) continue;
      // Decoded where the receiving stage wants its tensors (on its GPU when links.codec_device allows).
      absl::StatusOr<stage_runtime::LinkMessage> m =
          DecodeInFrame(r.first(), r.TakeBytes(), r.crc(), inbox->decode_target());
      if (!m.ok()) return reject(m.status());
      // Accepted frames are not acknowledged: an ack would queue behind this host's own uploads
      // on a slow access link and hold up the next frame's delivery (in the tc sweep, fp32 went
      // from 0.90 to 0.95 of the goodput bound without them). A clean end of the stream is the
      // sender's confirmation that everything arrived.
      if (absl::Status s = inbox->Push(*std::move(m), stripe_); !s.ok()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, std::string(s.message()));
      }
    }
    // A sender that finished cleanly half-closed the stream; one that died cancelled it. Either way
    // nothing more comes on it; a Pop that still needs a frame from it learns why.
    if (ctx_->IsCancelled()) {  // a broken stream breaks the whole link
      inbox->Close(absl::UnavailableError(absl::StrCat("link from ", inbox->peer(), " broke (peer died or cancelled)")));
    } else {
      inbox->Close(absl::UnavailableError(absl::StrCat("link from ", inbox->peer(), " closed")), stripe_);
    }
    return grpc::Status::OK;
  }

  grpc::GenericCallbackServerContext* const ctx_;
  const StageLinkService* const svc_;
  const int stripe_, stripes_;
  const int attempt_;  // the job attempt the sender runs
  grpc::ByteBuffer in_;  // the read in flight
  ChunkQueue chunks_;
  std::optional<grpc::ByteBuffer> reject_ack_;  // assembler only; gRPC reads it until OnDone
  absl::Notification started_;
  std::thread assembler_;
  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;   // no read in flight because the queue was full
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the assembler is done; no more reads
};

StageLinkService::StageLinkService(InboxRouter* router, int64_t max_frame_bytes)
    : router_(router), max_frame_bytes_(max_frame_bytes), buffers_(std::make_shared<FrameBufferPool>()) {}

grpc::ServerGenericBidiReactor* StageLinkService::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  if (ctx->method() != StageLinkStreamMethod()) {
    return new RejectedCall(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                         absl::StrCat("unknown method ", ctx->method(), " (this server serves ",
                                                      StageLinkStreamMethod(), ")")));
  }
  absl::StatusOr<std::pair<int, int>> stripe = StripeOf(*ctx);
  if (!stripe.ok()) {
    return new RejectedCall(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(stripe.status().message())));
  }
  absl::StatusOr<int> attempt = AttemptOf(*ctx);
  if (!attempt.ok()) {
    return new RejectedCall(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(attempt.status().message())));
  }
  absl::StatusOr<std::unique_ptr<StreamAdmission::Ticket>> ticket = LinkAdmission().Open(ctx->peer());
  if (!ticket.ok()) {
    return new RejectedCall(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(ticket.status().message())));
  }
  Stream* stream = new Stream(ctx, this, stripe->first, stripe->second, *attempt);
  stream->ticket = *std::move(ticket);
  return stream;
}

}  // namespace longhaul::worker
