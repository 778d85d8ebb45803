// Transport over gRPC: the `longhaul.v1.Collective` service (proto/longhaul/v1/collective.proto).
// Each rank runs the service on its process's gRPC server (a worker registers it next to
// StageLink) and sends each message as one client-streaming Send call on the peer's server:
// 1 MiB chunks, a CRC32C of the whole message, the call's deadline the message's.
//
//   CollectiveService service;                       // registered with the rank's grpc::Server
//   GrpcTransportOptions o;  o.group = "job-7/stage-2";  o.rank = 1;  o.addresses = {...};
//   absl::StatusOr<std::unique_ptr<GrpcTransport>> t = GrpcTransport::Create(&service, o);
//
// Receiving side (CollectiveService::Send, on gRPC's sync-server threads): one handler per
// incoming message reads its chunks, checks every header field against the first chunk and the
// chunking rule before copying data, refuses sizes above the mailbox's limit before allocating,
// checks the CRC and delivers the whole message into the (group, rank) Mailbox, waiting for buffer
// room up to the call's deadline. Several groups (stages, jobs) share one service.
// Sending side: one channel per peer (its own TCP connection, as pipeline links), shaped or paced per
// peer by the optional netem::LinkProfile, counters as TransportCounters.
// Threading: as Transport (Abort also cancels the calls of messages being sent and ends their waits
// for a shaped link's delivery; a pace's wait, one chunk's time at most, is not cut short); the
// service must outlive the server it is registered with, and each transport unregisters its
// mailbox on destruction.
#ifndef LONGHAUL_COLLECTIVE_GRPC_TRANSPORT_H_
#define LONGHAUL_COLLECTIVE_GRPC_TRANSPORT_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "collective/transport.h"
#include "common/throttled_log.h"
#include "longhaul/v1/collective.grpc.pb.h"

namespace longhaul::collective {

inline constexpr int64_t kCollectiveChunkBytes = 1 << 20;
inline constexpr size_t kMaxGroupNameBytes = 256;

// "/longhaul.v1.Collective/Send"'s chunk count for a message of `total` bytes.
uint64_t CollectiveChunkCount(uint64_t total);

class CollectiveService final : public v1::Collective::Service {
 public:
  CollectiveService() = default;
  ~CollectiveService() override = default;

  // Routes messages for (group, rank) to `box`; AlreadyExists when taken. `names` (empty, or one
  // per rank): with TLS, a message from rank r is taken only from the certificate named names[r].
  absl::Status Register(const std::string& group, std::shared_ptr<Mailbox> box,
                        std::vector<std::string> names = {});
  void Unregister(const std::string& group, int rank);

  grpc::Status Send(grpc::ServerContext* ctx, grpc::ServerReader<v1::CollectiveChunk>* reader,
                    v1::CollectiveAck* ack) override;
  grpc::Status Ping(grpc::ServerContext* ctx, const v1::CollectivePingRequest* req,
                    v1::CollectivePingReply* reply) override;

 private:
  struct Registered {
    std::shared_ptr<Mailbox> box;
    std::vector<std::string> names;
  };
  Registered Find(const std::string& group, int rank);
  common::ThrottledLog refusals_{"collective"};  // messages from the wrong certificate
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, Registered> boxes_ ABSL_GUARDED_BY(mu_);
};

struct GrpcTransportOptions {
  std::string group;
  int rank = 0;
  std::vector<std::string> addresses;  // host:port of every rank's server (this rank's unused)
  // Every rank's worker name (empty: not checked). With TLS, messages go only to, and are taken
  // only from, the certificate of that name (security::DataPlaneChannel's peer_name).
  std::vector<std::string> names;
  // The link from this rank to each peer (empty: unshaped and unpaced; else one per rank).
  std::vector<netem::LinkProfile> links;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  int64_t max_buffered_bytes = kDefaultMaxBufferedBytes;
  // How long an abort notice and a liveness ping may take per peer.
  absl::Duration notice_timeout = absl::Seconds(1);
};

class GrpcTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(CollectiveService* service,
                                                               GrpcTransportOptions o);
  ~GrpcTransport() override;

  int rank() const override { return o_.rank; }
  int size() const override { return static_cast<int>(o_.addresses.size()); }
  std::string PeerName(int peer) const override;
  absl::Status Send(int peer, uint64_t tag, absl::string_view data, absl::Time deadline) override;
  absl::StatusOr<std::string> Recv(int peer, uint64_t tag, absl::Time deadline) override;
  void Abort(const absl::Status& why) override;
  std::vector<std::string> UnreachablePeers(absl::Time deadline) override;
  TransportCounters counters() const override;

 private:
  GrpcTransport(CollectiveService* service, GrpcTransportOptions o, std::shared_ptr<Mailbox> box);
  // One message as chunks; `wait_for_ready`: wait (until the deadline) for a peer still starting.
  absl::Status SendMessage(int peer, uint64_t tag, absl::string_view data, absl::Time deadline,
                           bool wait_for_ready, int64_t* wire_bytes);

  CollectiveService* const service_;
  const GrpcTransportOptions o_;
  const std::shared_ptr<Mailbox> box_;
  std::vector<std::unique_ptr<v1::Collective::Stub>> stubs_;  // null for this rank
  std::vector<std::unique_ptr<PeerShaper>> shapers_;
  mutable absl::Mutex mu_;
  TransportCounters counters_ ABSL_GUARDED_BY(mu_);
  // The calls of messages being sent now, cancelled by Abort.
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_GRPC_TRANSPORT_H_
