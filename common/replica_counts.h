// How a job's workers are laid out over its stages' replicas, from the replica count of each stage
// alone (counts[s] = N_s >= 1) — the one rule, in plain C++ for the placement's cost model;
// proto/replica_layout.h applies it to a job spec for the coordinator and the workers
// (docs/replicated-stages.md).
//
// With M micro-batches a step, replica r of stage s takes the global micro-batches
// r*M/N_s .. (r+1)*M/N_s - 1 (every N_s divides M), so the global batch does not depend on the
// counts. A micro-batch travels from the replica of stage s that takes it to the replica of stage
// s+1 that takes it: with equal counts replica r talks only to replica r; with N_s = 2 and
// N_s+1 = 1 both replicas of s talk to the one of s+1.
//
// Slots: the job's workers in one list, replica-major: every stage's replica 0, then every stage
// that has one its replica 1, ...; with N replicas everywhere, replica r's stage s is slot r*S + s.
#ifndef LONGHAUL_COMMON_REPLICA_COUNTS_H_
#define LONGHAUL_COMMON_REPLICA_COUNTS_H_

#include <algorithm>
#include <vector>

namespace longhaul {

// The most replicas a stage may have (job specs, the benchmarks' flags).
inline constexpr int kMaxReplicas = 64;

struct ReplicaSlot {
  int stage = 0;
  int replica = 0;
};

// Every slot in order.
inline std::vector<ReplicaSlot> ReplicaSlots(const std::vector<int>& counts) {
  const int most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  std::vector<ReplicaSlot> slots;
  for (int r = 0; r < most; ++r) {
    for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
      if (r < counts[s]) slots.push_back({s, r});
    }
  }
  return slots;
}

// The slot of replica `replica` of `stage`, or -1 when there is no such replica.
inline int SlotOf(const std::vector<int>& counts, int stage, int replica) {
  const int S = static_cast<int>(counts.size());
  if (stage < 0 || stage >= S || replica < 0 || replica >= counts[stage]) return -1;
  int slot = 0;
  for (int q = 0; q < replica; ++q) {
    for (int s = 0; s < S; ++s) slot += q < counts[s] ? 1 : 0;
  }
  for (int s = 0; s < stage; ++s) slot += replica < counts[s] ? 1 : 0;
  return slot;
}

// The micro-batches of a step (of `micro_batches`) each of `replicas` replicas of a stage runs:
// M / N, at least 1.
inline int Share(int micro_batches, int replicas) { return std::max(1, micro_batches / std::max(1, replicas)); }
inline int ShareOf(const std::vector<int>& counts, int micro_batches, int stage) {
  return Share(micro_batches, counts[stage]);
}

// The replicas of `neighbour` (stage +- 1) that replica `replica` of `stage` exchanges
// micro-batches with: those whose share of the step overlaps its own, in replica order.
inline std::vector<int> ExchangingReplicas(const std::vector<int>& counts, int micro_batches, int stage, int replica,
                                           int neighbour) {
  const int m = ShareOf(counts, micro_batches, stage), first = replica * m;
  const int mn = ShareOf(counts, micro_batches, neighbour);
  std::vector<int> out;
  for (int q = 0; q < counts[neighbour]; ++q) {
    if (q * mn < first + m && first < (q + 1) * mn) out.push_back(q);
  }
  return out;
}

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_REPLICA_COUNTS_H_
