// GrpcLink: the stage_runtime::Link of a worker's stage to one neighbouring stage over the network:
// a LinkSender (link_sender.h: encode, shape, chunk, gRPC streams to the neighbour's StageLink
// service) and the Inbox (inbox.h) that the neighbour's frames arrive in through this worker's
// StageLinkService.
//
// Threading: as stage_runtime::Link — the stage's compute thread sends and receives, Abort may come
// from any thread.
#ifndef LONGHAUL_WORKER_GRPC_LINK_H_
#define LONGHAUL_WORKER_GRPC_LINK_H_

#include <memory>
#include <string>

#include "stage_runtime/link.h"
#include "worker/inbox.h"
#include "worker/link_sender.h"

namespace longhaul::worker {

class GrpcLink final : public stage_runtime::Link {
 public:
  // `inbox` receives the neighbour's frames; `sender` (started) sends to it.
  GrpcLink(std::shared_ptr<Inbox> inbox, std::unique_ptr<LinkSender> sender);
  ~GrpcLink() override;

  absl::Status Send(stage_runtime::LinkMessage m, bool measure_error) override;
  absl::StatusOr<stage_runtime::LinkMessage> Receive(absl::Duration timeout) override;
  absl::Status Finish() override;
  void Abort(absl::Status why) override;
  stage_runtime::LinkStats stats() override;
  absl::Duration TakeSendWait() override;
  const std::string& peer() const override { return inbox_->peer(); }
  // The sending direction's queue occupancy (LinkSender::queue_depth), for metrics.
  size_t queue_depth() { return sender_->queue_depth(); }

 private:
  const std::shared_ptr<Inbox> inbox_;
  const std::unique_ptr<LinkSender> sender_;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_GRPC_LINK_H_
