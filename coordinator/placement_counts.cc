#include "coordinator/placement_counts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/replica_counts.h"
#include "coordinator/placement_search.h"

namespace longhaul::coordinator::placement {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Operation k (0 .. 2m - 1) of stage s's schedule with m micro-batches: whether it is a forward,
// and of which of its micro-batches. The order of stage_runtime/schedule.cc's StageSchedule,
// restated because this library is torch-free and stage_runtime is not (placement.cc's recurrence
// restates it too).
std::pair<bool, int> Op(Schedule schedule, int S, int s, int m, int k) {
  if (schedule == Schedule::kGPipe) return k < m ? std::pair(true, k) : std::pair(false, k - m);
  const int w = std::min(S - s - 1, m);
  if (k < w) return {true, k};
  if (k < 2 * m - w) {
    const bool forward = (k - w) % 2 == 0;
    return {forward, forward ? w + (k - w) / 2 : (k - w) / 2};
  }
  return {false, k - m};
}

// A resource's busy time over the step and how many operations or messages it took.
struct Busy {
  double total = 0;
  int count = 0;
};

}  // namespace

Placement NaiveCountsPlacement(const std::vector<int>& counts) {
  Placement p(ReplicaSlots(counts).size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int>(i);
  return p;
}

Cost EvaluateCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c, const Placement& p) {
  const int S = job.stages, M = std::max(job.micro_batches, 1);
  const std::vector<ReplicaSlot> slots = ReplicaSlots(counts);
  const int K = static_cast<int>(slots.size());
  const double fwd_share = std::clamp(job.forward_share, 0.0, 1.0);
  std::vector<int> share(K);
  std::vector<double> cf(K), cb(K), free_at(K, 0.0);
  std::vector<std::vector<double>> act(K), grad(K);  // arrival of local micro-batch j's input; -1: not yet
  std::vector<std::vector<int>> of_stage(S);  // stage s's slots by replica
  std::vector<Busy> compute(K);
  int left = 0;
  for (int i = 0; i < K; ++i) {
    const int s = slots[i].stage;
    share[i] = ShareOf(counts, M, s);
    const double flops = c.flops_per_s[p[i]];
    const double cs = flops > 0 ? job.stage_flops[s] / flops : kInf;
    cf[i] = std::isinf(cs) ? kInf : fwd_share * cs;
    cb[i] = std::isinf(cs) ? kInf : cs - cf[i];
    act[i].assign(share[i], -1.0);
    grad[i].assign(share[i], -1.0);
    of_stage[s].push_back(i);
    left += 2 * share[i];
  }
  std::map<std::pair<int, int>, double> free_link;  // a directed pair of slots: when it is free
  std::map<std::pair<int, int>, Busy> links;
  // Slot i's output for global micro-batch g to the replica of stage `to` that takes it.
  auto send = [&](int i, int to, int g, bool forward, double end) {
    const int m = ShareOf(counts, M, to), r = g / m;
    const int k = of_stage[to][r];
    const Link& l = c.links[p[i]][p[k]];
    const double t = Transfer(l, forward ? job.activation_bytes : job.gradient_bytes);
    double& free = free_link[{i, k}];
    free = std::max(end, free) + t;
    Busy& b = links[{i, k}];
    b.total += t;
    ++b.count;
    (forward ? act : grad)[k][g - r * m] = free + l.latency_s;
  };
  // Sweeps alternately up and down the stages, as placement.cc's OneFOneB; a slot stops at an
  // operation whose input has not been computed.
  std::vector<int> next(K, 0);
  for (int sweep = 0, stalled = 0; left > 0 && stalled < 2; ++sweep) {
    const bool up = sweep % 2 == 0;
    bool moved = false;
    for (int n = 0; n < S; ++n) {
      const int s = up ? n : S - 1 - n;
      for (const int i : of_stage[s]) {
        for (;;) {
          const int k = next[i];
          if (k >= 2 * share[i]) break;
          const auto [forward, j] = Op(job.schedule, S, s, share[i], k);
          const double ready = forward ? (s == 0 ? 0.0 : act[i][j]) : (s == S - 1 ? 0.0 : grad[i][j]);
          if (ready < 0) break;
          const double t = forward ? cf[i] : cb[i];
          free_at[i] = std::max(free_at[i], ready) + t;
          compute[i].total += t;
          const int g = slots[i].replica * share[i] + j;
          if (forward && s + 1 < S) send(i, s + 1, g, true, free_at[i]);
          if (!forward && s > 0) send(i, s - 1, g, false, free_at[i]);
          next[i] = k + 1;
          --left;
          moved = true;
        }
      }
    }
    stalled = moved ? 0 : stalled + 1;
  }
  Cost out;
  double pipeline = left > 0 ? kInf : *std::max_element(free_at.begin(), free_at.end());
  // The clipping norm's scalars down and up the chain: at each boundary, the slowest pair's round.
  for (int s = 0; s + 1 < S; ++s) {
    double slowest = 0;
    for (const int i : of_stage[s]) {
      for (const int q : ExchangingReplicas(counts, M, s, slots[i].replica, s + 1)) {
        const int k = of_stage[s + 1][q];
        slowest = std::max(slowest, c.links[p[i]][p[k]].latency_s + c.links[p[k]][p[i]].latency_s);
      }
    }
    pipeline += slowest;
  }
  // The busiest resource sets the period; everything else is fill and drain.
  Busy neck;
  for (int i = 0; i < K; ++i) {
    compute[i].count = share[i];  // both passes of each of its micro-batches
    out.tiebreak += compute[i].total;
    if (compute[i].total > neck.total) {
      neck = compute[i];
      out.limit = Cost::Limit::kCompute;
      out.limit_stage = slots[i].stage;
      out.limit_replica = slots[i].replica;
    }
  }
  for (const auto& [ends, b] : links) {
    out.tiebreak += b.total;
    if (b.total > neck.total) {
      neck = b;
      const ReplicaSlot& from = slots[ends.first];
      const bool forward = slots[ends.second].stage > from.stage;
      out.limit = forward ? Cost::Limit::kLinkForward : Cost::Limit::kLinkBackward;
      out.limit_stage = from.stage;
      out.limit_replica = from.replica;
    }
  }
  out.period_s = neck.count > 0 ? neck.total / neck.count : 0;  // per micro-batch
  out.fill_drain_s = std::isinf(pipeline) ? kInf : pipeline - Times(neck.count - 1, out.period_s);
  // Each replica group's sync (placement.h's C_DP with the stage's own N_s).
  for (int s = 0; s < S; ++s) {
    const int n = static_cast<int>(of_stage[s].size());
    if (n < 2) continue;
    const double bytes = s < static_cast<int>(job.stage_grad_bytes.size()) ? job.stage_grad_bytes[s] / n : 0.0;
    double group = 0;
    for (const int i : of_stage[s]) {
      double total = 0;
      for (const int k : of_stage[s]) {
        if (k == i) continue;
        const Link& l = c.links[p[i]][p[k]];
        total += 2 * (l.latency_s + Transfer(l, bytes));
      }
      group = std::max(group, total);
    }
    out.dp_s = std::max(out.dp_s, group);
    out.tiebreak += group;
  }
  out.step_s = pipeline + out.dp_s;
  return out;
}

std::vector<SlotCost> SlotCosts(const JobShape& job, const std::vector<int>& counts, const Cluster& c,
                                const Placement& p) {
  const std::vector<ReplicaSlot> slots = ReplicaSlots(counts);
  std::vector<SlotCost> out(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i].stage, w = p[i];
    out[i].cost.compute_s = c.flops_per_s[w] > 0 ? job.stage_flops[s] / c.flops_per_s[w] : kInf;
    if (s + 1 == job.stages) continue;
    for (const int q : ExchangingReplicas(counts, job.micro_batches, s, slots[i].replica, s + 1)) {
      const int k = SlotOf(counts, s + 1, q), v = p[k];
      const double f = c.links[w][v].latency_s + Transfer(c.links[w][v], job.activation_bytes);
      const double b = c.links[v][w].latency_s + Transfer(c.links[v][w], job.gradient_bytes);
      if (out[i].next < 0 || f + b > out[i].cost.forward_s + out[i].cost.backward_s) {
        out[i].cost.forward_s = f, out[i].cost.backward_s = b, out[i].next = k;
      }
    }
  }
  return out;
}

Solution SolveCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c, const SolveOptions& o) {
  const int K = static_cast<int>(ReplicaSlots(counts).size()), N = c.size();
  if (N < K) {
    Solution out;
    out.method = absl::StrCat("not enough workers: ", K, " needed, ", N, " given");
    return out;
  }
  LocalSearch search(K, N, o, [&](const Placement& p) { return EvaluateCounts(job, counts, c, p); });
  Solution best;
  best.placement = NaiveCountsPlacement(counts);
  best.cost = search.Eval(best.placement);
  int rounds = 0;
  for (; rounds <= o.rounds && !search.OutOfTime(); ++rounds) {
    Placement p = best.placement;
    if (rounds > 0) search.Perturb(p);
    Cost cost = search.Eval(p);
    for (bool improved = true; improved && !search.OutOfTime();) improved = search.SwapsAndReplacements(p, cost);
    if (Better(cost, best.cost)) std::tie(best.placement, best.cost) = std::pair(p, cost);
  }
  best.evaluated = search.evaluated();
  best.method = absl::StrCat("local search over the ", K, " slots of the replica counts on ", N, " workers (", rounds,
                             " rounds, ", best.evaluated, " placements costed)");
  return best;
}

}  // namespace longhaul::coordinator::placement
