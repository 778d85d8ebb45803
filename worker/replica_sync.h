// ReplicaSync: the data-parallel synchronisation of one replicated stage (docs/replicated-stages.md)
// — the LibTorch side of collective/: after the backward pass it flattens the stage's parameter
// gradients, runs the job's data-parallel codec among the stage's replicas over the collective
// gRPC transport (collective/grpc_transport.h, on the worker's own server), and steps the
// optimizer so that every replica ends the step with bit-identical weights.
//
//   fp32          ring all-reduce of the gradients (bit-identical sums), divided by the replica
//                 count; then the executor's own AdamW on every replica (replicated optimizer: the
//                 same numbers in, the same numbers out; checkpoints keep the optimizer state).
//   bitdp1/bitdp2 BitDP's all-gather and exact reduction (the same sum on every replica), then as
//                 fp32.
//   sdp4bit       SDP4Bit: TLq-HS reduce-scatter, each replica updates its shard's fp32 main
//   zeropp        weights with AdamW (this class's, on flat buffers; state for the shard only), qWD
//                 (zeropp: qwZ) all-gather of the weights (collective/data_parallel.h). The
//                 executor's parameters are then set to the gathered model copy; its own optimizer
//                 state is not used. Each replica's checkpoints hold its shard's state
//                 (CheckpointState / RestoreState), so a job restarts from them as from the
//                 others'.
// Clipping uses the global gradient: each replica's squared norm of its owned part of the
// synchronised gradient is summed over the replicas (an exact all-gather of doubles on a second
// group, so nested inside the sharded step's own calls), then along the pipeline by the loop's
// norm exchange. The step's loss is the mean over the replicas, gathered the same way.
//
// Threading: SyncAndStep on the stage's compute thread; Abort from any thread.
#ifndef LONGHAUL_WORKER_REPLICA_SYNC_H_
#define LONGHAUL_WORKER_REPLICA_SYNC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collective/data_parallel.h"
#include "collective/grpc_transport.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/stage_loop.h"

namespace longhaul::worker {

struct ReplicaSyncOptions {
  std::string group;                   // unique per job, stage and attempt
  int rank = 0;                        // this replica's index
  std::vector<std::string> addresses;  // every replica's gRPC server, in replica order
  // Every replica's worker name, in replica order (TLS: each message is taken only from, and sent
  // only to, the certificate of that name); empty: not checked.
  std::vector<std::string> names;
  std::vector<std::string> regions;    // every replica's --region ("" counts as one region)
  collective::DpCodec codec = collective::DpCodec::kFp32;
  int weight_bits = 4;                 // sdp4bit qWD / zeropp qwZ
  absl::Duration timeout = absl::Seconds(120);
  std::vector<netem::LinkProfile> links;  // empty: unshaped; else one per replica
  uint64_t seed = 1;
};

class ReplicaSync final : public stage_runtime::GradientSync {
 public:
  // `service`, `exec` (not owned) must outlive this.
  static absl::StatusOr<std::unique_ptr<ReplicaSync>> Create(collective::CollectiveService* service,
                                                             ReplicaSyncOptions o, stage_runtime::StageExecutor* exec,
                                                             stage_runtime::OptimizerConfig optimizer);
  // The same over transports the caller made (an in-process driver: collective::InProcessHub, one
  // hub per group): `dp` carries the gradients and weights, `scalars` the norms and losses; both
  // of this replica's rank. `o.group`, `o.addresses` and `o.links` are not used (the transports
  // have their own); `o.regions` gives the topology.
  static absl::StatusOr<std::unique_ptr<ReplicaSync>> CreateOver(std::unique_ptr<collective::Transport> dp,
                                                                 std::unique_ptr<collective::Transport> scalars,
                                                                 ReplicaSyncOptions o, stage_runtime::StageExecutor* exec,
                                                                 stage_runtime::OptimizerConfig optimizer);
  ~ReplicaSync() override;

  absl::StatusOr<Outcome> SyncAndStep(uint64_t step, double loss, const ExchangeNorms& exchange_norms) override;
  void Abort(const absl::Status& why) override;
  // sdp4bit / zeropp: this replica's shard of the optimizer state (AdamW's moments and the fp32
  // main weights), with the codec, rank and replica count it belongs to; empty for the others,
  // whose optimizer state is the executor's own.
  stage_runtime::TensorFile CheckpointState() const override;
  // After the executor restored a checkpoint of step exec->step() (with its sync_state): takes
  // that state back. A sharded codec's state must be there and be this rank's of the same group
  // shape (a DataLoss error naming what differs); the others ignore it.
  absl::Status RestoreState(const stage_runtime::TensorFile& state);

  // The last step's data-parallel calls (gradients and weights; the scalars left out).
  const collective::CallStats& last() const { return last_; }
  collective::DpCodec codec() const { return o_.codec; }
  // Every call's, the scalars' included, since Create (Group::totals of both groups).
  collective::CallStats totals() const;

 private:
  ReplicaSync(ReplicaSyncOptions o, stage_runtime::StageExecutor* exec, stage_runtime::OptimizerConfig optimizer)
      : o_(std::move(o)), exec_(exec), opt_(optimizer) {}
  // Sums `values` over the replicas, exactly and in rank order (the same doubles everywhere).
  absl::StatusOr<std::vector<double>> SumScalars(const std::vector<double>& values);
  void Flatten(bool grads, std::vector<float>* out) const;
  void Unflatten(const std::vector<float>& in, bool grads);
  // AdamW on the owned range of the flat buffer (sdp4bit, zeropp).
  void Adam(int64_t step, int64_t offset, absl::Span<const float> grad, absl::Span<float> main, double clip);

  const ReplicaSyncOptions o_;
  stage_runtime::StageExecutor* const exec_;
  const stage_runtime::OptimizerConfig opt_;
  // The groups and the data-parallel state (after the transports are set).
  absl::Status Init();

  std::unique_ptr<collective::Transport> dp_transport_, scalar_transport_;
  std::unique_ptr<collective::Group> dp_group_, scalar_group_;
  std::unique_ptr<collective::DataParallelSync> dp_;
  int64_t n_ = 0;
  std::vector<char> decayed_;      // per element: weight decay applies (matrices)
  std::vector<float> grad_, weights_, m_, v_;
  collective::CallStats last_;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_REPLICA_SYNC_H_
