// The StageLink service (data_plane.proto) on gRPC's public generic callback API: a
// grpc::CallbackGenericService, registered with ServerBuilder::RegisterCallbackGenericService.
// Chunks arrive as raw ByteBuffers so their payload is copied once, straight into the reassembly
// buffer (chunk_wire.h, link_receiver.h); on the wire it is the same service, and clients of the
// generated v1::StageLink::Stub work unchanged. A generic service sees every method the server is
// asked for: anything but "/longhaul.v1.StageLink/Stream" ends with UNIMPLEMENTED, naming it.
//
//   StageLinkService svc(&router);
//   grpc::ServerBuilder b;  ConfigureLonghaulServer(&b);  b.RegisterCallbackGenericService(&svc);
//
// Threading, per stream (one gRPC call):
//   - the read reaction (OnReadDone, on gRPC's callback threads) parses the chunk's header fields
//     (ParseChunk: no payload copy), queues the chunk in the stream's bounded ChunkQueue and starts
//     the next read; when the queue is full it starts none, and the assembler restarts reading
//     once it took a chunk, so HTTP/2 flow control pushes back on the sender;
//   - the stream's assembler thread (ours) checks the stripe, finds the inbox (InboxRouter::Find
//     may wait for the job), copies payloads into the reassembly buffer (checksumming each piece
//     right after copying it), validates and decodes each frame and pushes it into the Inbox
//     (blocking while its stream's share is full); it alone writes to the stream (the error ack)
//     and finishes the call. The socket is drained while the previous chunk is copied and checked.
// Per chunk that is one hop from gRPC's callback thread to the assembler, as with the synchronous
// API's handler thread before. The OnDone reaction joins the assembler and frees the stream.
// The service must outlive the server it is registered with (grpc::Server::Shutdown waits for
// every stream's OnDone, hence for every assembler thread).
#ifndef LONGHAUL_WORKER_LINK_SERVICE_H_
#define LONGHAUL_WORKER_LINK_SERVICE_H_

#include <cstdint>
#include <memory>

#include <grpcpp/generic/async_generic_service.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/channel_config.h"  // ConfigureLonghaulServer, for the servers this is registered with
#include "worker/inbox.h"
#include "worker/link_receiver.h"
#include "worker/link_wire.h"

namespace longhaul::worker {

// Where the StageLink service delivers a link's frames: the worker maps (job, attempt, sending
// stage and replica) to the inbox of the stage it hosts. Find may wait up to `wait` for that attempt of the job
// to be set up (a neighbour can start sending before this worker has processed its own assignment)
// and fails at once for an attempt older than the one it runs. Called from the streams' assembler
// threads.
class InboxRouter {
 public:
  virtual ~InboxRouter() = default;
  virtual absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int attempt, int from_stage, int from_replica,
                                                      absl::Duration wait) = 0;
  // On a mutual-TLS server, after Find: whether the worker whose certificate names `sender` is the
  // one the coordinator assigned to send this job's frames from replica `from_replica` of
  // `from_stage` (docs/security.md). A refused stream is ended before any of its frames reach the
  // inbox, so the job is unaffected.
  virtual absl::Status CheckSender(uint64_t job_id, int from_stage, int from_replica, const std::string& sender) {
    return absl::OkStatus();
  }
};

class StageLinkService final : public grpc::CallbackGenericService {
 public:
  explicit StageLinkService(InboxRouter* router, int64_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Called by gRPC for each incoming call.
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  class Stream;
  InboxRouter* const router_;
  const int64_t max_frame_bytes_;
  const std::shared_ptr<FrameBufferPool> buffers_;  // reassembly buffers, shared by streams
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_SERVICE_H_
