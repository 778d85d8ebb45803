// Bandwidth-aware placement: a cost model that predicts the step time of a pipeline job placed on
// given workers, and solvers that choose the workers and their order. Plain C++ (no LibTorch, no
// proto): the coordinator builds a JobShape from the job spec (job_cost.h) and a Cluster from its
// link matrix; tests build both by hand.
//
//   JobShape job = ...;   Cluster c = ...;          // c.links[i][j]: worker i sends to worker j
//   Solution s = Solve(job, c, {});                 // exact when small, else local search
//   Cost naive = Evaluate(job, c, NaivePlacement(job));
//
// The cost model (docs/placement.md), for replica r of D and micro-batches M:
//   compute    c_s = stage_flops_s / flops_per_s(worker of stage s)
//   link s->s+1, per micro-batch: forward f_s = alpha + activation_bytes / bw (s to s+1),
//                                 backward b_s = alpha + gradient_bytes / bw (s+1 to s)
//   steady state: a pipeline advances one micro-batch per period P = max(max_s c_s,
//     max_s max(act/bw_fwd, grad/bw_bwd)) -- its slowest stage or link, a bottleneck, not a sum
//     (the two directions of a link carry different messages at the same time);
//   fill and drain: one micro-batch through every stage and link and back, F = sum_s c_s + sum_s (f_s + b_s);
//   clipping's gradient-norm scalars down and up the chain: N = sum_s (alpha_fwd + alpha_bwd);
//   T_r = (M - 1) P + F + N (GPipe and 1F1B alike: (M + S - 1) c for a balanced compute-bound pipeline);
//   data-parallel sync (DT-FM): C_DP = max over stages s and members i of stage s's replica group of
//     sum_{j != i} 2 (alpha_ij + grad_bytes_s / (D beta_ij));
//   step = max_r T_r + C_DP.
// Latency alpha is half the measured RTT; bandwidth the measured throughput, capped by the job's
// in-process emulation (links.rate_mbit), whose delay adds to alpha (job_cost.h).
//
// Solvers: SolveExact enumerates every ordered choice of workers (branch and bound on a prefix
// bound, replicas' symmetry removed), optimal under the model; SolveHeuristic seeds with the
// naive order and greedy constructions and improves them by iterated local search (swap, replace
// by an unused worker, reverse or move a segment of a pipeline). Neither returns anything worse
// than the naive order. Solve picks the exact search when it enumerates at most `exact_limit`
// placements (every instance of up to 8 workers).
//
// Thread safety: pure functions.
#ifndef LONGHAUL_COORDINATOR_PLACEMENT_H_
#define LONGHAUL_COORDINATOR_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace longhaul::coordinator::placement {

// One direction of a link between two workers.
struct Link {
  double latency_s = 0;    // one way (DT-FM's alpha)
  double bytes_per_s = 0;  // throughput (beta / 8); <= 0 means unusable
};

struct Cluster {
  std::vector<double> flops_per_s;        // per worker, what its stages achieve
  std::vector<std::vector<Link>> links;   // links[i][j]: i sends to j (the diagonal is unused)
  int size() const { return static_cast<int>(flops_per_s.size()); }
};

// A job as the model sees it, independent of where it runs.
struct JobShape {
  int stages = 1;
  int replicas = 1;       // data-parallel pipelines (DT-FM's D); 1 until replicated stages exist
  int micro_batches = 1;  // per step
  std::vector<double> stage_flops;       // forward + backward of one micro-batch, per stage
  double activation_bytes = 0;           // on the wire, per micro-batch and link, forward
  double gradient_bytes = 0;             // on the wire, per micro-batch and link, backward
  std::vector<double> stage_grad_bytes;  // per stage: parameter gradients synced among replicas
  int workers() const { return stages * replicas; }
};

// Worker index (into the Cluster) of replica r's stage s at [r * stages + s].
using Placement = std::vector<int>;

struct Cost {
  double step_s = 0;        // the prediction
  double period_s = 0;      // the slowest pipeline's steady-state time per micro-batch
  double fill_drain_s = 0;  // that pipeline's fill and drain (and gradient-norm exchange)
  double dp_s = 0;          // data-parallel sync; 0 with one replica
  // Sum of every stage's and link's time per micro-batch and of every replica group's sync time:
  // among placements with the same step time, the one with less work off the critical path is
  // preferred (local search needs a slope where the maximum is flat).
  double tiebreak = 0;
  // What sets the period: compute of a stage, or the link from that stage to the next.
  enum class Limit { kCompute, kLinkForward, kLinkBackward };
  Limit limit = Limit::kCompute;
  int limit_replica = 0;
  int limit_stage = 0;
};

// Per stage of one replica, for display: compute and the link to the next stage, per micro-batch.
struct StageCost {
  double compute_s = 0;
  double forward_s = 0;   // latency + activation bytes / bandwidth (0 on the last stage)
  double backward_s = 0;  // latency + gradient bytes / bandwidth back from the next stage
};

// `p` must hold job.workers() distinct indices into `c`.
Cost Evaluate(const JobShape& job, const Cluster& c, const Placement& p);
std::vector<StageCost> StageCosts(const JobShape& job, const Cluster& c, const Placement& p, int replica = 0);

// The first job.workers() workers in index order: stage s of replica r on worker r * stages + s.
Placement NaivePlacement(const JobShape& job);

// n! / (n - k)!, saturating at INT64_MAX: how many placements an exhaustive search enumerates
// (before removing the replicas' symmetry).
int64_t OrderedChoices(int n, int k);

struct SolveOptions {
  int64_t exact_limit = 200000;  // Solve searches exhaustively up to this many placements
  int rounds = 300;              // iterated local search: perturbations of the best placement
  absl::Duration time_limit = absl::Seconds(5);  // the heuristic stops after this much wall time
  uint64_t seed = 1;
};

struct Solution {
  Placement placement;
  Cost cost;
  bool exact = false;
  int64_t evaluated = 0;  // complete placements costed
  std::string method;     // e.g. "exact search over 1680 placements of 8 workers"
};

Solution SolveExact(const JobShape& job, const Cluster& c);
Solution SolveHeuristic(const JobShape& job, const Cluster& c, const SolveOptions& o = {});
Solution Solve(const JobShape& job, const Cluster& c, const SolveOptions& o = {});

// True when `a` is a better prediction than `b` (step time first, then the tie-break).
bool Better(const Cost& a, const Cost& b);

// A lower bound of every placement's step time on `c` (docs/placement.md, "The per-group lower
// bound"): each group -- a stage's D workers, the D (S - 1) links of the pipelines, a stage's
// replica group -- gets its own best workers, chosen independently of the others, and from each
// group's best the bound keeps only what holds whatever the others took:
//   period    >= max over stages s of the D-th smallest compute time of s over all workers,
//             >= the K-th smallest (K = S D placed workers, all distinct) of min_s c_s(w), and
//             >= the D (S - 1)-th smallest over workers i of min_j max(act / bw_ij, grad / bw_ji)
//                (the links' senders are distinct workers);
//   fill      >= sum_s min_w c_s(w) + (S - 1) min_{i != j} (the link's fill and norm terms);
//   sync      >= max over s of the D-th smallest over workers i of L_i(s), the sum of i's D - 1
//                cheapest DT-FM pair costs 2 (alpha_ij + grad_s / (D beta_ij)), and
//             >= the K-th smallest of L_i for the smallest stage's gradients;
//   step      >= (M - 1) period + fill + sync.
// Each group's term is at most what an exhaustive search over that group alone would give, so the
// bound is below both that per-group optimum and the true optimum. O(S N + N^2 log N).
struct Bound {
  double step_s = 0;
  double period_s = 0;
  double fill_drain_s = 0;
  double dp_s = 0;
};
Bound LowerBound(const JobShape& job, const Cluster& c);

}  // namespace longhaul::coordinator::placement

#endif  // LONGHAUL_COORDINATOR_PLACEMENT_H_
