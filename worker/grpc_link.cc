#include "worker/grpc_link.h"

namespace longhaul::worker {

GrpcLink::GrpcLink(std::shared_ptr<Inbox> inbox, std::unique_ptr<LinkSender> sender)
    : inbox_(std::move(inbox)), sender_(std::move(sender)) {}

// The sender's threads are joined here (a link that was not finished is torn down); the inbox is
// shared with the StageLink service and lives on until its last stream lets go.
GrpcLink::~GrpcLink() {
  sender_->Cancel();
  inbox_->Cancel(absl::CancelledError("link closed"));
}

absl::Status GrpcLink::Send(stage_runtime::LinkMessage m, bool measure_error) {
  return sender_->Send(std::move(m), measure_error);
}

absl::StatusOr<stage_runtime::LinkMessage> GrpcLink::Receive(absl::Duration timeout) {
  return inbox_->Pop(timeout);
}

absl::Status GrpcLink::Finish() { return sender_->Finish(); }

void GrpcLink::Abort(absl::Status why) {
  inbox_->Cancel(why);
  sender_->Abort(why);
}

stage_runtime::LinkStats GrpcLink::stats() { return sender_->stats(); }

absl::Duration GrpcLink::TakeSendWait() { return sender_->TakeSendWait(); }

}  // namespace longhaul::worker
