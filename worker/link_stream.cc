#include "worker/link_stream.h"

#include <grpcpp/generic/generic_stub.h>

namespace longhaul::worker {

LinkStream::LinkStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::vector<std::pair<std::string, std::string>>& metadata)
    : method_(method) {
  for (const auto& [key, value] : metadata) ctx_.AddMetadata(key, value);
  // The stub only carries the channel; the call keeps what it needs.
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  stub.PrepareBidiStreamingCall(&ctx_, method_, grpc::StubOptions(), this);
  // Our threads start operations from outside the reactions: the hold keeps the call (and OnDone)
  // from completing under them until Finish or the destructor releases it.
  AddHold();
  StartCall();
}

LinkStream::~LinkStream() {
  bool finished;
  {
    absl::MutexLock l(&mu_);
    finished = released_;
  }
  if (!finished) ctx_.TryCancel();
  ReleaseAndWait();
}

bool LinkStream::Write(grpc::ByteBuffer* msg) {
  {
    absl::MutexLock l(&mu_);
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queued_.size() < kQueuedWrites || write_failed_;
    };
    mu_.Await(absl::Condition(&room));
    if (write_failed_) return false;
    if (writing_) {  // OnWriteDone starts it
      queued_.emplace_back().Swap(msg);
      return true;
    }
    writing_ = true;
  }
  // No write was in flight: out_ is ours until StartWrite hands it to gRPC.
  out_.Swap(msg);
  StartWrite(&out_);
  return true;
}

bool LinkStream::WritesDone() {
  {
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; };
    mu_.Await(absl::Condition(&idle));
    if (write_failed_) return false;
  }
  // Its completion needs no waiting: a failure shows in the call's status (Finish).
  StartWritesDone();
  return true;
}

bool LinkStream::Read(grpc::ByteBuffer* msg) {
  {
    absl::MutexLock l(&mu_);
    reading_ = true;
  }
  StartRead(&in_);
  absl::MutexLock l(&mu_);
  auto read = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !reading_; };
  mu_.Await(absl::Condition(&read));
  if (!read_ok_) return false;
  msg->Swap(&in_);
  return true;
}

grpc::Status LinkStream::Finish() { return ReleaseAndWait(); }

grpc::Status LinkStream::ReleaseAndWait() {
  bool release = false;
  {
    absl::MutexLock l(&mu_);
    if (!released_) released_ = release = true;
  }
  if (release) RemoveHold();
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

void LinkStream::OnWriteDone(bool ok) {
  out_.Clear();  // drops the chunk's references to its frame now rather than at the next write
  {
    absl::MutexLock l(&mu_);
    if (!ok) {  // the call is over: nothing more goes out
      write_failed_ = true;
      queued_.clear();
    }
    if (queued_.empty()) {
      writing_ = false;
      return;
    }
    out_.Swap(&queued_.front());
    queued_.pop_front();
  }
  StartWrite(&out_);  // the next chunk, straight from the reaction
}

void LinkStream::OnReadDone(bool ok) {
  absl::MutexLock l(&mu_);
  reading_ = false;
  read_ok_ = ok;
}

void LinkStream::OnDone(const grpc::Status& s) {
  absl::MutexLock l(&mu_);
  status_ = s;
  done_ = true;
}

}  // namespace longhaul::worker
