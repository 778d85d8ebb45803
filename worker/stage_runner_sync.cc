// StageRunner's replicated-stage part (stage_runner.h): the synchronisation among a stage's
// replicas after each backward pass, over the worker's Collective service (replica_sync.h).
#include "absl/strings/str_cat.h"
#include "worker/link_settings.h"
#include "worker/stage_runner.h"

namespace longhaul::worker {

absl::Status StageRunner::SetupReplicaSync() {
  const v1::JobSpec& spec = a_.spec();
  if (collective_ == nullptr) return absl::FailedPreconditionError("this worker has no Collective service");
  absl::StatusOr<collective::DpCodec> codec =
      collective::ParseDpCodec(spec.data_parallel().codec().empty() ? "fp32" : spec.data_parallel().codec());
  if (!codec.ok()) return codec.status();
  ReplicaSyncOptions ro;
  // A new group per attempt: a failed group stays failed (collective/group.h).
  ro.group = absl::StrCat("job-", a_.job_id(), "/stage-", a_.stage(), "/attempt-", a_.attempt());
  ro.rank = a_.replica_index();
  for (const v1::StagePeer& p : a_.replica_group()) {
    ro.addresses.push_back(p.address());
    ro.names.push_back(p.name());
    ro.regions.push_back(p.region());
  }
  ro.codec = *codec;
  ro.weight_bits = spec.data_parallel().weight_bits();
  if (spec.data_parallel().timeout_seconds() > 0) ro.timeout = absl::Seconds(spec.data_parallel().timeout_seconds());
  ro.seed = spec.seed() * 1000 + static_cast<uint64_t>(a_.stage());
  // The same emulated (or paced) links as the pipeline's (links: in the spec), per peer: those in
  // other regions at links.between_regions_mbit when it is set.
  absl::StatusOr<std::vector<netem::LinkProfile>> links = ReplicaLinkProfiles(
      spec.links(), ro.regions, ro.rank, spec.seed() * 1000 + 500 + a_.stage() * 64 + ro.rank);
  if (!links.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", a_.job_id(), " stage ", a_.stage(), ": ", links.status().message()));
  }
  ro.links = std::move(*links);
  absl::StatusOr<std::unique_ptr<ReplicaSync>> rs = ReplicaSync::Create(collective_, std::move(ro), exec_.get(), opt_.optimizer);
  if (!rs.ok()) return rs.status();
  sync_ = std::move(*rs);
  // A restart: the sync's own part of the restored checkpoint (a sharded optimizer's shard).
  if (a_.restore_step() > 0) {
    if (absl::Status s = sync_->RestoreState(restored_sync_state_); !s.ok()) return s;
  }
  restored_sync_state_ = {};
  return absl::OkStatus();
}

}  // namespace longhaul::worker
