// Bandwidth-aware placement: a cost model that predicts the step time of a pipeline job placed on
// given workers, and solvers that choose the workers and their order. Plain C++ (no LibTorch, no
// proto): the coordinator builds a JobShape from the job spec (job_cost.h) and a Cluster from its
// link matrix; tests build both by hand.
//
//   JobShape job = ...;   Cluster c = ...;          // c.links[i][j]: worker i sends to worker j
//   Solution s = Solve(job, c, {});                 // exact when small, else local search
//   Cost naive = Evaluate(job, c, NaivePlacement(job));
//
// The cost model (docs/placement.md, "The cost model"), for replica r of D and micro-batches M:
//   compute    per micro-batch c_s = stage_flops_s / flops_per_s(worker of stage s), split into
//              forward cf_s = forward_share c_s and backward cb_s = c_s - cf_s
//   link s->s+1, per micro-batch: forward  f_s = alpha + tf_s, tf_s = activation_bytes / bw (s to s+1)
//                                 backward b_s = alpha + tb_s, tb_s = gradient_bytes / bw (s+1 to s)
//   GPipe: all forwards, then all backwards: two flow lines, each paced by its slowest stage or
//     link direction (a bottleneck, not a sum), each with its own fill and drain:
//     T_r = (M - 1)(P_F + P_B) + sum_s c_s + sum_s (f_s + b_s) + N,
//     P_F = max(max_s cf_s, max_s tf_s), P_B = max(max_s cb_s, max_s tb_s);
//   1F1B: warm-up (stage s runs min(S - s - 1, M) forwards first), a steady state in which a link
//     carries activations one way and gradients the other at once, cool-down: no closed form for
//     mixed stages and links, so T_r = N + the step's own recurrence (every operation starts when
//     its stage is free and its input has arrived; a link direction sends one message at a time,
//     in order); the reported period is max_s max(c_s, tf_s, tb_s), the fill and drain the rest;
//   clipping's gradient-norm scalars down and up the chain: N = sum_s (alpha_fwd + alpha_bwd);
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
#include <limits>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace longhaul::coordinator::placement {

// One direction of a link between two workers.
struct Link {
  double latency_s = 0;    // one way (DT-FM's alpha)
  double bytes_per_s = 0;  // throughput (beta / 8); <= 0 means unusable
};

// Seconds to push `bytes` through `l`, latency excluded; an unusable link takes forever.
inline double Transfer(const Link& l, double bytes) {
  if (bytes <= 0) return 0;
  return l.bytes_per_s > 0 ? bytes / l.bytes_per_s : std::numeric_limits<double>::infinity();
}

// (M - 1) x, where M = 1 makes an infinite x count nothing (0 x infinity is NaN).
inline double Times(double m1, double x) { return m1 > 0 ? m1 * x : 0.0; }

struct Cluster {
  std::vector<double> flops_per_s;        // per worker, what its stages achieve
  std::vector<std::vector<Link>> links;   // links[i][j]: i sends to j (the diagonal is unused)
  int size() const { return static_cast<int>(flops_per_s.size()); }
};

// The order of a stage's forward and backward micro-batch operations within a step
// (stage_runtime/schedule.h): GPipe runs every forward first; 1F1B runs min(S - s - 1, M)
// forwards on stage s, then alternates forward and backward, then the remaining backwards.
enum class Schedule { k1F1B, kGPipe };
const char* ScheduleName(Schedule s);  // "1f1b" | "gpipe"

// A job as the model sees it, independent of where it runs.
struct JobShape {
  int stages = 1;
  Schedule schedule = Schedule::k1F1B;
  double forward_share = 1.0 / 3;  // of a stage's compute: the backward pass costs twice the forward
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
  // The slowest pipeline is (M - 1) period_s + fill_drain_s. period_s: what each further
  // micro-batch adds at the bottleneck (GPipe: P_F + P_B; 1F1B: the busiest stage's c_s or link
  // direction's transfer); fill_drain_s: the rest -- fill, drain, 1F1B's waits in warm-up and
  // cool-down, the gradient-norm exchange.
  double period_s = 0;
  double fill_drain_s = 0;
  double dp_s = 0;          // data-parallel sync; 0 with one replica
  // Sum of every stage's and link's time per micro-batch and of every replica group's sync time:
  // among placements with the same step time, the one with less work off the critical path is
  // preferred (local search needs a slope where the maximum is flat).
  double tiebreak = 0;
  // What sets the period: compute of a stage, or the link from that stage to the next (GPipe: in
  // the phase with the longer period).
  enum class Limit { kCompute, kLinkForward, kLinkBackward };
  Limit limit = Limit::kCompute;
  int limit_replica = 0;
  int limit_stage = 0;
};

// Per slot, for display (SlotCosts): compute and the link to the next stage, per micro-batch.
struct StageCost {
  double compute_s = 0;
  double forward_s = 0;   // latency + activation bytes / bandwidth (0 on the last stage)
  double backward_s = 0;  // latency + gradient bytes / bandwidth back from the next stage
};

// `p` must hold job.workers() distinct indices into `c`.
Cost Evaluate(const JobShape& job, const Cluster& c, const Placement& p);

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
//   compute   c_lo(s) = the D-th smallest compute time of stage s over all workers (D distinct
//                       workers hold a stage); c_any = the K-th smallest (K = S D placed workers,
//                       all distinct) of min_s c_s(w);
//   links     l_lo = the D (S - 1)-th smallest over workers i of min_j x(i, j) (the links' senders
//                    are distinct workers), x = max(act / bw_ij, grad / bw_ji) for 1F1B and the
//                    sum for GPipe (whose phases use one direction each);
//   fill      F_lo = sum_s min_w c_s(w) + (S - 1) min_{i != j} (the link's fill and norm terms);
//   GPipe     pipeline >= (M - 1) max(c_lo, c_any, l_lo) + F_lo (P_F + P_B >= c_s, >= tf + tb);
//   1F1B      pipeline >= (M - 1) l_lo + F_lo (a link's M transfers with one micro-batch's trip
//             before and after), >= M c_any, >= M c_lo(k) + sum_{s<k} (min_w c_s(w) + cheapest
//             link) for each k (stage k's M forwards and backwards, the fill before it and the
//             drain after it);
//   sync      >= max over s of the D-th smallest over workers i of L_i(s), the sum of i's D - 1
//                cheapest DT-FM pair costs 2 (alpha_ij + grad_s / (D beta_ij)), and
//             >= the K-th smallest of L_i for the smallest stage's gradients;
//   step      >= pipeline + sync.
// Each group's term is at most what an exhaustive search over that group alone would give, so the
// bound is below both that per-group optimum and the true optimum. O(S N + N^2 log N). (Defined
// in placement_sim.cc, beside the simulated plans that report it.)
struct Bound {
  double step_s = 0;
  double period_s = 0;      // max(c_lo, c_any, l_lo)
  double fill_drain_s = 0;  // pipeline's bound - (M - 1) period_s
  double dp_s = 0;
};
Bound LowerBound(const JobShape& job, const Cluster& c);

}  // namespace longhaul::coordinator::placement

#endif  // LONGHAUL_COORDINATOR_PLACEMENT_H_
