// How a job's workers are laid out over its stages' replicas (docs/replicated-stages.md): the rule
// of common/replica_counts.h applied to a job spec, shared by the coordinator (slots, assignments,
// placement) and the workers (a replica's share of the step, which neighbours it streams to).
//
// Stage s runs on N_s workers: the spec's `replicas: N` (every stage N) or `replicas: [N_0, ...]`
// (JobSpec.stage_replicas); validation makes every N_s divide micro_batches.
#ifndef LONGHAUL_PROTO_REPLICA_LAYOUT_H_
#define LONGHAUL_PROTO_REPLICA_LAYOUT_H_

#include <algorithm>
#include <string>
#include <vector>

#include "common/replica_counts.h"
#include "longhaul/v1/control_plane.pb.h"

namespace longhaul {

// N_s: the workers of stage s (1 for a spec without replicas; a list entry out of range counts 1).
inline int StageReplicas(const v1::JobSpec& spec, int stage) {
  if (spec.stage_replicas_size() > 0) {
    return stage >= 0 && stage < spec.stage_replicas_size() ? std::max(1, spec.stage_replicas(stage)) : 1;
  }
  return std::max(1, spec.replicas());
}

// N_s of every stage.
inline std::vector<int> ReplicaCounts(const v1::JobSpec& spec) {
  std::vector<int> counts;
  for (int s = 0; s < spec.stages(); ++s) counts.push_back(StageReplicas(spec, s));
  return counts;
}

// Whether any stage has more than one replica (its replicas then synchronise).
inline bool HasReplicas(const v1::JobSpec& spec) {
  for (int s = 0; s < spec.stages(); ++s) {
    if (StageReplicas(spec, s) > 1) return true;
  }
  return false;
}

// Whether the counts differ between stages (a per-stage list that is not one number).
inline bool ReplicaCountsDiffer(const v1::JobSpec& spec) {
  for (int s = 1; s < spec.stages(); ++s) {
    if (StageReplicas(spec, s) != StageReplicas(spec, 0)) return true;
  }
  return false;
}

// The most replicas of any stage.
inline int MaxReplicas(const v1::JobSpec& spec) {
  int n = 1;
  for (int s = 0; s < spec.stages(); ++s) n = std::max(n, StageReplicas(spec, s));
  return n;
}

// The workers a job needs: the sum of N_s.
inline int WorkersNeeded(const v1::JobSpec& spec) {
  int n = 0;
  for (int s = 0; s < spec.stages(); ++s) n += StageReplicas(spec, s);
  return n;
}

// The micro-batches of a step each replica of `stage` runs (M / N_s; at least 1).
inline int ReplicaMicroBatches(const v1::JobSpec& spec, int stage) {
  return Share(spec.micro_batches(), StageReplicas(spec, stage));
}

// "2 stages", "2 stages x 2 replicas", "2 stages with replicas [2, 1]": for messages.
inline std::string DescribeStages(const v1::JobSpec& spec) {
  std::string d = std::to_string(spec.stages()) + (spec.stages() == 1 ? " stage" : " stages");
  if (!HasReplicas(spec)) return d;
  if (!ReplicaCountsDiffer(spec)) return d + " x " + std::to_string(StageReplicas(spec, 0)) + " replicas";
  d += " with replicas [";
  for (int s = 0; s < spec.stages(); ++s) d += (s ? ", " : "") + std::to_string(StageReplicas(spec, s));
  return d + "]";
}

// Every slot in order (common/replica_counts.h).
inline std::vector<ReplicaSlot> ReplicaSlots(const v1::JobSpec& spec) { return ReplicaSlots(ReplicaCounts(spec)); }

// The slot of replica `replica` of `stage`, or -1 when the job has no such replica.
inline int SlotOf(const v1::JobSpec& spec, int stage, int replica) { return SlotOf(ReplicaCounts(spec), stage, replica); }

// The replicas of `neighbour` (stage +- 1) that replica `replica` of `stage` exchanges micro-batches
// with, in replica order.
inline std::vector<int> ExchangingReplicas(const v1::JobSpec& spec, int stage, int replica, int neighbour) {
  return ExchangingReplicas(ReplicaCounts(spec), spec.micro_batches(), stage, replica, neighbour);
}

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_REPLICA_LAYOUT_H_
