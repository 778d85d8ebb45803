// How a job's workers are laid out over its stages' replicas (docs/replicated-stages.md): the one
// rule the coordinator (slots, assignments, placement) and the workers (a replica's share of the
// step, which neighbours it streams to) share.
//
// Stage s runs on N_s workers: the spec's `replicas: N` (every stage N) or `replicas: [N_0, ...]`
// (JobSpec.stage_replicas). With M micro-batches a step, replica r of stage s takes the global
// micro-batches r*M/N_s .. (r+1)*M/N_s - 1 (validation makes every N_s divide M), so the global
// batch does not depend on the counts. A micro-batch travels from the replica of stage s that takes
// it to the replica of stage s+1 that takes it: with equal counts replica r talks only to replica r,
// with N_s = 2 and N_s+1 = 1 both replicas of s talk to the one of s+1 (a fan-in forward, a fan-out
// backward).
//
// Slots: the job's workers in one list (JobStatus.stages), replica-major: every stage's replica 0,
// then every stage that has one its replica 1, ...; with N replicas everywhere, replica r's stage s
// is slot r*S + s.
#ifndef LONGHAUL_PROTO_REPLICA_LAYOUT_H_
#define LONGHAUL_PROTO_REPLICA_LAYOUT_H_

#include <algorithm>
#include <string>
#include <vector>

#include "longhaul/v1/control_plane.pb.h"

namespace longhaul {

// N_s: the workers of stage s (1 for a spec without replicas; a list entry out of range counts 1).
inline int StageReplicas(const v1::JobSpec& spec, int stage) {
  if (spec.stage_replicas_size() > 0) {
    return stage >= 0 && stage < spec.stage_replicas_size() ? std::max(1, spec.stage_replicas(stage)) : 1;
  }
  return std::max(1, spec.replicas());
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
  return std::max(1, spec.micro_batches() / StageReplicas(spec, stage));
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

struct ReplicaSlot {
  int stage = 0;
  int replica = 0;
};

// Every slot in order (see the top of this file).
inline std::vector<ReplicaSlot> ReplicaSlots(const v1::JobSpec& spec) {
  std::vector<ReplicaSlot> slots;
  for (int r = 0, n = MaxReplicas(spec); r < n; ++r) {
    for (int s = 0; s < spec.stages(); ++s) {
      if (r < StageReplicas(spec, s)) slots.push_back({s, r});
    }
  }
  return slots;
}

// The slot of replica `replica` of `stage`, or -1 when the job has no such replica.
inline int SlotOf(const v1::JobSpec& spec, int stage, int replica) {
  if (stage < 0 || stage >= spec.stages() || replica < 0 || replica >= StageReplicas(spec, stage)) return -1;
  int slot = 0;
  for (int q = 0; q < replica; ++q) {
    for (int s = 0; s < spec.stages(); ++s) slot += q < StageReplicas(spec, s) ? 1 : 0;
  }
  for (int s = 0; s < stage; ++s) slot += replica < StageReplicas(spec, s) ? 1 : 0;
  return slot;
}

// The replicas of `neighbour` (stage +- 1) that replica `replica` of `stage` exchanges micro-batches
// with: those whose share of the step overlaps its own, in replica order.
inline std::vector<int> ExchangingReplicas(const v1::JobSpec& spec, int stage, int replica, int neighbour) {
  const int m = ReplicaMicroBatches(spec, stage), first = replica * m;
  const int mn = ReplicaMicroBatches(spec, neighbour);
  std::vector<int> out;
  for (int q = 0; q < StageReplicas(spec, neighbour); ++q) {
    if (q * mn < first + m && first < (q + 1) * mn) out.push_back(q);
  }
  return out;
}

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_REPLICA_LAYOUT_H_
