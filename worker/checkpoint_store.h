// Stage checkpoints copied between workers, for recovery (docs/recovery.md): a dead machine's disk
// is gone, so every checkpoint a stage writes is also copied to another worker (its replica: the
// worker of the next stage, the last stage's to stage 0's; in a one-stage job with replicas, the
// next replica's), and a worker that takes over the stage restores it from there. A copy is named
// by its job, stage, data-parallel replica and step: the replicas of a stage whose optimizer state
// is sharded (sdp4bit, zeropp) have checkpoints that differ.
//
//   worker side (server):  CheckpointStoreService svc({.data_dir = dir, .max_bytes = 64 << 30}, locate);
//                          builder.RegisterService(&svc);     // on the worker's data-plane server
//   stage side (client):   CheckpointReplicator r(target, ...);  r.Enqueue(step, path);  // in order
//   restore:               FetchCheckpoint(peer_address, peer_name, job, stage, replica, step, dest, max_bytes);
//
// Files on a worker: its own checkpoints are <checkpoint dir>/stage-S.safetensors (the latest, as
// before) plus a hard link per checkpointed step, stage-S.step-N.safetensors (StepCheckpointPath);
// the copies it holds for others are <data dir>/replicas/job-J/replica-R/stage-S.step-N.safetensors
// (ReplicaPath). Both are pruned to the coordinator's checkpoint floor (CheckpointFloor: older
// steps are no longer needed by any recovery), and to the newest kKeepCheckpoints steps per stage
// (and, for the copies, per replica) whatever the floor.
//
// Transfers (data_plane.proto, service CheckpointStore): 1 MiB chunks in order; the receiver checks
// the offsets, the announced size against its limit and the free disk space before writing, and
// the whole file's CRC32C (in the last chunk) before it renames the file into place, so a copy is
// either complete and checked or absent. Errors name the peer, the file and the limit.
//
// Threading: the service's handlers run on gRPC's sync-server threads; a replicator has one thread
// of its own; FetchCheckpoint blocks its caller.
#ifndef LONGHAUL_WORKER_CHECKPOINT_STORE_H_
#define LONGHAUL_WORKER_CHECKPOINT_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "longhaul/v1/control_plane.pb.h"
#include "longhaul/v1/data_plane.grpc.pb.h"

namespace longhaul::worker {

// Steps kept per stage whatever the floor says (a floor that never advances, replication off).
inline constexpr int kKeepCheckpoints = 4;
// Largest checkpoint a worker accepts as a replica unless told otherwise (--replica-max-gib).
inline constexpr int64_t kDefaultReplicaMaxBytes = int64_t{64} << 30;

// <dir>/stage-<stage>.step-<step>.safetensors
std::string StepCheckpointPath(const std::string& dir, int stage, int64_t step);
// <data_dir>/replicas/job-<job>/replica-<replica>/stage-<stage>.step-<step>.safetensors: a copy
// this worker holds (replica: the data-parallel replica whose checkpoint it is, 0 in a job without
// replicas)
std::string ReplicaPath(const std::string& data_dir, uint64_t job_id, int stage, int replica, int64_t step);

// Deletes the step files of `stage` in `dir` (StepCheckpointPath names) older than `floor`, and all
// but the newest kKeepCheckpoints; the newest is always kept. Returns how many it deleted.
int PruneStepFiles(const std::string& dir, int stage, int64_t floor);

// Records that `path` (the stage's latest checkpoint, just written for `step`) is that step's
// checkpoint too: a hard link (a copy where links are not possible) at StepCheckpointPath. The
// checkpoint writer replaces `path` by renaming a new file over it, so the link keeps this step's.
absl::Status KeepStepFile(const std::string& path, const std::string& dir, int stage, int64_t step);

struct CheckpointStoreOptions {
  std::string data_dir;                        // replicas go under <data_dir>/replicas
  int64_t max_bytes = kDefaultReplicaMaxBytes;  // largest replica accepted
};

class CheckpointStoreService final : public v1::CheckpointStore::Service {
 public:
  // `locate(job, stage, replica, step)`: the path of a checkpoint this worker wrote itself as that
  // replica of that stage ("" if none), for Get requests that are not for a copy it holds.
  using Locate = std::function<std::string(uint64_t job_id, int stage, int replica, int64_t step)>;
  CheckpointStoreService(CheckpointStoreOptions o, Locate locate);

  grpc::Status Put(grpc::ServerContext* ctx, grpc::ServerReader<v1::CheckpointChunk>* reader,
                   v1::PutCheckpointResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetCheckpointRequest* req,
                   grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

  // Deletes the replicas of `job_id` older than `floor` (CheckpointFloor).
  void Prune(uint64_t job_id, int64_t floor);

 private:
  const CheckpointStoreOptions opt_;
  const Locate locate_;
  absl::Mutex mu_;
  uint64_t next_tmp_ ABSL_GUARDED_BY(mu_) = 0;  // unique temporary names for concurrent Puts
};

// Sends the file at `path` to the CheckpointStore at `target` as replica `replica` of stage
// `stage`'s checkpoint of `step`. `ctx` may be cancelled from another thread. Returns the bytes sent. `peer_worker`: the
// name of the worker at `target` (with TLS the handshake checks it; "": any worker of the cluster).
absl::StatusOr<int64_t> PushCheckpoint(const std::string& target, const std::string& peer_worker,
                                       const std::string& path, uint64_t job_id, int stage, int replica,
                                       int64_t step, grpc::ClientContext* ctx);
// Gets replica `replica` of stage `stage`'s checkpoint of `step` from the CheckpointStore at `target` (worker
// `peer_worker`, as above) into `dest` (written whole and checked, then renamed into place).
// Refuses files larger than `max_bytes`.
absl::StatusOr<int64_t> FetchCheckpoint(const std::string& target, const std::string& peer_worker, uint64_t job_id,
                                        int stage, int replica, int64_t step, const std::string& dest,
                                        int64_t max_bytes, absl::Duration timeout = absl::Hours(2));

// Copies a stage's checkpoints to its replica worker, one at a time and in order, on a thread of
// its own; each outcome is reported (CheckpointReplicated). At most kMaxPending wait: when a newer
// checkpoint comes while that many wait, the oldest waiting one is dropped (reported as an error),
// so a link too slow for the checkpoint interval holds back recovery, not training.
class CheckpointReplicator {
 public:
  static constexpr size_t kMaxPending = 2;
  using Report = std::function<void(const v1::CheckpointReplicated&)>;
  struct Target {
    uint64_t worker_id = 0;
    std::string name;
    std::string address;
  };
  CheckpointReplicator(Target target, uint64_t job_id, int stage, int replica, int attempt, Report report);
  // Cancels the copy in flight and drops the waiting ones.
  ~CheckpointReplicator();

  void Enqueue(int64_t step, std::string path);

 private:
  void Loop();

  const Target target_;
  const uint64_t job_id_;
  const int stage_, replica_, attempt_;
  const Report report_;
  absl::Mutex mu_;
  std::deque<std::pair<int64_t, std::string>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_CHECKPOINT_STORE_H_
