// Bandwidth-aware placement of jobs whose stages have different replica counts (`replicas: [2, 1]`,
// common/replica_counts.h). Such a job is not D identical pipelines, so placement.h's model and
// its exact search do not apply; this is the same model written for any counts, with a local
// search. Plain C++, as placement.h.
//
// The cost model: slot (stage s, replica r) runs its share m_s = M / N_s of the step's M
// micro-batches in the schedule's order (stage_runtime/schedule.h with m_s micro-batches: 1F1B's
// min(S - s - 1, m_s) warm-up forwards, then forward and backward alternately, then the rest;
// GPipe's forwards, then backwards), each operation starting when its worker is free and its input
// has arrived. Global micro-batch g's activation goes from the replica of stage s that takes it to
// the replica of stage s + 1 that takes it, its gradient back; each direction of each pair of
// workers carries one message at a time, in the order sent (latency and transfer as placement.h's
// f_s and b_s). With equal counts this is placement.h's 1F1B recurrence, replica by replica. Then
// the clipping norm's latencies down and up the chain (the slowest pair at each boundary: with
// equal counts placement.h adds each pipeline's own, so this is no lower), and the
// data-parallel sync of each stage with N_s > 1 (DT-FM's, as placement.h: the slowest member's
// sum over the others of 2 (alpha + grad_bytes_s / (N_s beta))).
//
// Placement: p[i] is the worker (index into the Cluster) of slot i, in common/replica_counts.h's
// slot order.
//
// Thread safety: pure functions.
#ifndef LONGHAUL_COORDINATOR_PLACEMENT_COUNTS_H_
#define LONGHAUL_COORDINATOR_PLACEMENT_COUNTS_H_

#include <vector>

#include "coordinator/placement.h"

namespace longhaul::coordinator::placement {

// `job.micro_batches` is the whole step's M (every count divides it); `job.replicas` is not used.
// `p` holds one distinct worker per slot. Cost::limit_stage / limit_replica name the busiest
// resource's slot (its worker for kCompute, the sender of the link otherwise).
Cost EvaluateCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c, const Placement& p);

// Per slot, for display (placement.h's StageCost): its compute per micro-batch, and the slowest
// (by forward plus backward time) of its links to the replicas of the next stage it streams to,
// `next`: that replica's slot (-1 on the last stage, whose links are left at 0).
struct SlotCost {
  StageCost cost;
  int next = -1;
};
std::vector<SlotCost> SlotCosts(const JobShape& job, const std::vector<int>& counts, const Cluster& c,
                                const Placement& p);

// The slots in order on workers 0 .. K-1.
Placement NaiveCountsPlacement(const std::vector<int>& counts);

// Iterated local search from the naive order (placement_search.h's moves: swap two slots' workers,
// an unused worker in a slot's place; random kicks between descents), within o.rounds and
// o.time_limit; never worse than the naive order. An empty placement when `c` has fewer workers
// than slots.
Solution SolveCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c, const SolveOptions& o = {});

}  // namespace longhaul::coordinator::placement

#endif  // LONGHAUL_COORDINATOR_PLACEMENT_COUNTS_H_
