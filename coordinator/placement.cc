#include "coordinator/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/placement_search.h"

namespace longhaul::coordinator::placement {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One pipeline's stages and links (placed stages 0..n-1 of S), per micro-batch.
struct Pipe {
  int n = 0;
  std::vector<double> cf, cb;          // forward and backward compute, per stage
  std::vector<double> af, tf, ab, tb;  // link s -> s+1: latency and transfer, forward and backward
};

// The 1F1B step of `p` (stages 0..n-1 of an S-stage pipeline), by its recurrence: stage s runs
// its operations in the schedule's order (stage_runtime/schedule.cc: min(S - s - 1, M) warm-up
// forwards, then forward and backward alternately, then the remaining backwards), each starting
// when the stage is free and its input has arrived; a link direction transfers one message at a
// time, in the order they were sent. The last placed stage of a prefix (n < S) takes its
// gradients as given: the result is the longest path of a subgraph of the full step's, so a
// lower bound of every completion's. O(n (M + n)).
double OneFOneB(const Pipe& p, int S, int M, std::vector<double>& scratch, std::vector<int>& next) {
  const int n = p.n;
  scratch.assign(static_cast<size_t>(2 * n * M + 4 * n), -1.0);
  next.assign(n, 0);  // per stage: index of its next operation
  double* act = scratch.data();        // [s * M + j]: activation j at stage s (from s - 1)
  double* grad = act + n * M;          // [s * M + j]: gradient j at stage s (from s + 1)
  double* free_at = grad + n * M;      // per stage: when its last operation ends
  double* fwd_free = free_at + n;      // per link s -> s+1: when its forward direction is free
  double* bwd_free = fwd_free + n;     // and its backward one
  for (int s = 0; s < n; ++s) free_at[s] = fwd_free[s] = bwd_free[s] = 0;
  int left = 2 * n * M;
  // Sweeps alternately up and down the pipeline: an upward one carries activations all the way,
  // a downward one gradients; a stage stops at an operation whose input has not been computed.
  for (int sweep = 0, stalled = 0; left > 0 && stalled < 2; ++sweep) {
    const bool up = sweep % 2 == 0;
    bool moved = false;
    for (int i = 0; i < n; ++i) {
      const int s = up ? i : n - 1 - i;
      const int w = std::min(S - s - 1, M);
      for (;;) {
        const int k = next[s];
        if (k >= 2 * M) break;
        bool forward;
        int j;
        if (k < w) {
          forward = true, j = k;
        } else if (k < 2 * M - w) {
          forward = (k - w) % 2 == 0, j = forward ? w + (k - w) / 2 : (k - w) / 2;
        } else {
          forward = false, j = k - M;
        }
        const double ready = forward ? (s == 0 ? 0.0 : act[s * M + j]) : (s == n - 1 ? 0.0 : grad[s * M + j]);
        if (ready < 0) break;  // not computed yet
        const double end = std::max(free_at[s], ready) + (forward ? p.cf[s] : p.cb[s]);
        free_at[s] = end;
        if (forward && s + 1 < n) {
          fwd_free[s] = std::max(end, fwd_free[s]) + p.tf[s];
          act[(s + 1) * M + j] = fwd_free[s] + p.af[s];
        } else if (!forward && s > 0) {
          bwd_free[s - 1] = std::max(end, bwd_free[s - 1]) + p.tb[s - 1];
          grad[(s - 1) * M + j] = bwd_free[s - 1] + p.ab[s - 1];
        }
        next[s] = k + 1;
        --left;
        moved = true;
      }
    }
    stalled = moved ? 0 : stalled + 1;
  }
  if (left > 0) return kInf;  // cannot happen: the schedule has no cycle
  return *std::max_element(free_at, free_at + n);
}

// The cost of the placed prefix p[0..n): for n == job.workers() the placement's cost, for a
// shorter prefix a lower bound of every completion's, since every term (a maximum or a sum of
// non-negative times, or a longest path in a graph that only grows) only grows as stages are
// added. The exact search prunes on it.
Cost EvaluatePrefix(const JobShape& job, const Cluster& c, const int* p, int n) {
  const int S = job.stages;
  const int D = job.replicas;
  const int M = std::max(job.micro_batches, 1);
  const double M1 = M - 1;
  const double fwd_share = std::clamp(job.forward_share, 0.0, 1.0);
  thread_local Pipe pipe;
  thread_local std::vector<double> scratch;
  thread_local std::vector<int> next;
  Cost out;
  double worst = -1;
  for (int r = 0; r < D && r * S < n; ++r) {
    const int base = r * S;
    const int placed = std::min(S, n - base);
    pipe.n = placed;
    for (auto* v : {&pipe.cf, &pipe.cb, &pipe.af, &pipe.tf, &pipe.ab, &pipe.tb}) v->assign(placed, 0.0);
    double work = 0, norm = 0;
    for (int s = 0; s < placed; ++s) {
      const int w = p[base + s];
      const double flops = c.flops_per_s[w];
      const double cs = flops > 0 ? job.stage_flops[s] / flops : kInf;
      pipe.cf[s] = fwd_share * cs;
      pipe.cb[s] = cs - pipe.cf[s];
      if (std::isinf(cs)) pipe.cf[s] = pipe.cb[s] = kInf;
      work += cs;
      if (s + 1 >= placed) continue;
      const int v = p[base + s + 1];
      const Link& fw = c.links[w][v];
      const Link& bw = c.links[v][w];
      pipe.af[s] = fw.latency_s, pipe.tf[s] = Transfer(fw, job.activation_bytes);
      pipe.ab[s] = bw.latency_s, pipe.tb[s] = Transfer(bw, job.gradient_bytes);
      norm += fw.latency_s + bw.latency_s;
      work += pipe.tf[s] + pipe.tb[s];
    }
    // The bottleneck of a direction of travel: a stage's compute in it or a link's transfer.
    using Limit = Cost::Limit;
    struct Neck {
      double t = 0;
      Limit limit = Limit::kCompute;
      int stage = 0;
    };
    auto neck = [&](const std::vector<double>& compute, const std::vector<double>& link, Limit link_limit) {
      Neck b;
      for (int s = 0; s < placed; ++s) {
        if (compute[s] > b.t) b = {compute[s], Limit::kCompute, s};
        if (s + 1 < placed && link[s] > b.t) b = {link[s], link_limit, s};
      }
      return b;
    };
    double t, period, fill;
    Neck limit;
    if (job.schedule == Schedule::kGPipe) {
      // A forward flow line, then a backward one: M identical micro-batches through a line of
      // one-at-a-time resources take the sum of their times plus (M - 1) times the slowest's.
      const Neck pf = neck(pipe.cf, pipe.tf, Limit::kLinkForward);
      const Neck pb = neck(pipe.cb, pipe.tb, Limit::kLinkBackward);
      limit = pf.t >= pb.t ? pf : pb;
      period = pf.t + pb.t;
      fill = norm;
      for (int s = 0; s < placed; ++s) fill += pipe.cf[s] + pipe.cb[s] + pipe.af[s] + pipe.tf[s] + pipe.ab[s] + pipe.tb[s];
      t = Times(M1, period) + fill;
    } else {
      // The busiest resource: a stage runs both passes of every micro-batch, each link direction
      // carries one message per micro-batch.
      for (int s = 0; s < placed; ++s) {
        if (pipe.cf[s] + pipe.cb[s] > limit.t) limit = {pipe.cf[s] + pipe.cb[s], Limit::kCompute, s};
        if (s + 1 >= placed) continue;
        if (pipe.tf[s] > limit.t) limit = {pipe.tf[s], Limit::kLinkForward, s};
        if (pipe.tb[s] > limit.t) limit = {pipe.tb[s], Limit::kLinkBackward, s};
      }
      period = limit.t;
      t = OneFOneB(pipe, S, M, scratch, next) + norm;
      fill = std::isinf(t) ? kInf : t - Times(M1, period);  // >= period: t >= M x any resource's time
    }
    out.tiebreak += work;
    if (t > worst) {
      worst = t;
      out.period_s = period;
      out.fill_drain_s = fill;
      out.limit = limit.limit;
      out.limit_replica = r;
      out.limit_stage = limit.stage;
    }
  }
  double dp = 0, group = 0;
  if (D > 1) {
    for (int s = 0; s < S; ++s) {
      const double grad = s < static_cast<int>(job.stage_grad_bytes.size()) ? job.stage_grad_bytes[s] : 0.0;
      for (int ri = 0; ri < D && ri * S + s < n; ++ri) {
        const int i = p[ri * S + s];
        double total = 0;
        for (int rj = 0; rj < D && rj * S + s < n; ++rj) {
          if (rj == ri) continue;
          const Link& l = c.links[i][p[rj * S + s]];
          total += 2 * (l.latency_s + Transfer(l, grad / D));
        }
        dp = std::max(dp, total);
        group = std::max(group, total);
      }
      out.tiebreak += group;  // every group's sync, not only the slowest's
      group = 0;
    }
  }
  out.dp_s = dp;
  out.step_s = std::max(worst, 0.0) + dp;
  return out;
}

bool Within(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
}

// Local search and its moves over one placement: LocalSearch's (a swap of two positions, an
// unused worker in place of a used one), and a pipeline's segment reversed (which turns its links
// around) or one stage moved elsewhere in its pipeline.
class Search {
 public:
  Search(const JobShape& job, const Cluster& c, const SolveOptions& o)
      : job_(job), c_(c), K_(job.workers()), N_(c.size()),
        moves_(K_, N_, o, [this](const Placement& p) { return EvaluatePrefix(job_, c_, p.data(), K_); }) {}

  int64_t evaluated() const { return moves_.evaluated(); }
  bool OutOfTime() const { return moves_.OutOfTime(); }
  Cost Eval(const Placement& p) { return moves_.Eval(p); }
  void Perturb(Placement& p) { moves_.Perturb(p); }

  // A greedy construction from `first`: each next position takes the worker that keeps the
  // prefix's bound lowest.
  Placement Greedy(int first) {
    Placement p{first};
    std::vector<char> used(N_, 0);
    used[first] = 1;
    while (static_cast<int>(p.size()) < K_) {
      int best_w = -1;
      Cost best;
      p.push_back(0);
      for (int w = 0; w < N_; ++w) {
        if (used[w]) continue;
        p.back() = w;
        const Cost x = EvaluatePrefix(job_, c_, p.data(), static_cast<int>(p.size()));
        if (best_w < 0 || Better(x, best)) std::tie(best_w, best) = std::pair(w, x);
      }
      p.back() = best_w;
      used[best_w] = 1;
    }
    return p;
  }

  // First-improvement descent until no move improves (or time is up).
  void Descend(Placement& p, Cost& cost) {
    const int S = job_.stages;
    for (bool improved = true; improved && !OutOfTime();) {
      improved = moves_.SwapsAndReplacements(p, cost);
      auto keep = [&](auto undo) { improved |= moves_.Keep(p, cost, undo); };
      for (int base = 0; base < K_; base += S) {
        for (int i = 0; i < S; ++i) {
          for (int j = i + 1; j < S; ++j) {
            auto first = p.begin() + base + i, last = p.begin() + base + j + 1;
            std::reverse(first, last);
            keep([&] { std::reverse(first, last); });
            if (j > i + 1) {  // one stage moved from i to j, and from j to i
              std::rotate(first, first + 1, last);
              keep([&] { std::rotate(first, last - 1, last); });
              std::rotate(first, last - 1, last);
              keep([&] { std::rotate(first, first + 1, last); });
            }
          }
        }
      }
    }
  }

  // DT-FM's order of decisions, for data-parallel jobs (D > 1), where one worker moved at a time
  // rarely improves the slowest replica group: first the S groups of D workers that sync cheaply
  // with each other, then their order along the pipelines and which members form each pipeline.
  // Groups are grown one at a time around a seed worker, each time taking the worker that keeps
  // the group's most loaded member lowest; `isolated_first` seeds each group with the worker
  // whose D - 1 cheapest partners cost most (the hardest to place, so that the last group is not
  // left with the scattered rest), otherwise with the best-connected one. The order: from each
  // group as stage 0, the next stage is the group whose greedy bottleneck matching to the last
  // stage is cheapest; the best of these S chains under the full model is returned.
  Placement Grouped(bool isolated_first) {
    const int S = job_.stages, D = job_.replicas;
    double grad = 0;
    for (double g : job_.stage_grad_bytes) grad = std::max(grad, g);
    auto sync = [&](int i, int j) {  // both members' share of a pair's DT-FM cost
      const Link& a = c_.links[i][j];
      const Link& b = c_.links[j][i];
      return 2 * (a.latency_s + Transfer(a, grad / D)) + 2 * (b.latency_s + Transfer(b, grad / D));
    };
    std::vector<char> free(N_, 1);
    std::vector<std::vector<int>> groups;
    std::vector<double> costs;
    for (int k = 0; k < S; ++k) {
      int seed = -1;
      double seed_h = 0;
      for (int u = 0; u < N_; ++u) {
        if (!free[u]) continue;
        costs.clear();
        for (int v = 0; v < N_; ++v) {
          if (v != u && free[v]) costs.push_back(sync(u, v));
        }
        const int take = std::min<int>(D - 1, static_cast<int>(costs.size()));
        std::partial_sort(costs.begin(), costs.begin() + take, costs.end());
        const double h = std::accumulate(costs.begin(), costs.begin() + take, 0.0);
        if (seed < 0 || (isolated_first ? h > seed_h : h < seed_h)) std::tie(seed, seed_h) = std::pair(u, h);
      }
      std::vector<int> g{seed};
      std::vector<double> load{0};  // per member: the sum of its pair costs within the group
      free[seed] = 0;
      while (static_cast<int>(g.size()) < D) {
        int best = -1;
        double best_max = 0;
        for (int v = 0; v < N_; ++v) {
          if (!free[v]) continue;
          double own = 0, worst = 0;
          for (size_t m = 0; m < g.size(); ++m) {
            const double x = sync(g[m], v);
            own += x;
            worst = std::max(worst, load[m] + x);
          }
          worst = std::max(worst, own);
          if (best < 0 || worst < best_max) std::tie(best, best_max) = std::pair(v, worst);
        }
        double own = 0;
        for (size_t m = 0; m < g.size(); ++m) {
          load[m] += sync(g[m], best);
          own += sync(g[m], best);
        }
        load.push_back(own);
        g.push_back(best);
        free[best] = 0;
      }
      groups.push_back(std::move(g));
    }
    // One pipeline link's time per micro-batch: 1F1B's steady state uses both directions at once
    // (the slower counts), GPipe's phases one after the other (both count).
    auto link = [&](int a, int b) {
      const double f = c_.links[a][b].latency_s + Transfer(c_.links[a][b], job_.activation_bytes);
      const double g = c_.links[b][a].latency_s + Transfer(c_.links[b][a], job_.gradient_bytes);
      return job_.schedule == Schedule::kGPipe ? f + g : std::max(f, g);
    };
    // Members of `next` matched to the pipelines ending in `last`: cheapest pairs first.
    auto match = [&](const std::vector<int>& last, const std::vector<int>& next, std::vector<int>* out) {
      std::vector<std::tuple<double, int, int>> pairs;
      for (int r = 0; r < D; ++r) {
        for (int m = 0; m < D; ++m) pairs.emplace_back(link(last[r], next[m]), r, m);
      }
      std::sort(pairs.begin(), pairs.end());
      out->assign(D, -1);
      std::vector<char> taken(D, 0);
      double worst = 0;
      for (const auto& [t, r, m] : pairs) {
        if ((*out)[r] >= 0 || taken[m]) continue;
        (*out)[r] = next[m];
        taken[m] = 1;
        worst = std::max(worst, t);
      }
      return worst;
    };
    Placement best;
    Cost best_cost;
    for (int first = 0; first < S && !OutOfTime(); ++first) {
      std::vector<std::vector<int>> stage{groups[first]};  // stage s's workers by replica
      std::vector<char> used(S, 0);
      used[first] = 1;
      std::vector<int> m;
      for (int s = 1; s < S; ++s) {
        int pick = -1;
        double pick_t = 0;
        for (int k = 0; k < S; ++k) {
          if (used[k]) continue;
          const double t = match(stage.back(), groups[k], &m);
          if (pick < 0 || t < pick_t) std::tie(pick, pick_t) = std::pair(k, t);
        }
        used[pick] = 1;
        match(stage.back(), groups[pick], &m);
        stage.push_back(m);
      }
      Placement p(K_);
      for (int r = 0; r < D; ++r) {
        for (int s = 0; s < S; ++s) p[r * S + s] = stage[s][r];
      }
      const Cost x = Eval(p);
      if (best.empty() || Better(x, best_cost)) std::tie(best, best_cost) = std::pair(p, x);
    }
    return best;
  }

 private:
  const JobShape& job_;
  const Cluster& c_;
  const int K_, N_;
  LocalSearch moves_;
};

}  // namespace

const char* ScheduleName(Schedule s) { return s == Schedule::kGPipe ? "gpipe" : "1f1b"; }

bool Better(const Cost& a, const Cost& b) {
  if (!Within(a.step_s, b.step_s)) return a.step_s < b.step_s;
  return !Within(a.tiebreak, b.tiebreak) && a.tiebreak < b.tiebreak;
}

Cost Evaluate(const JobShape& job, const Cluster& c, const Placement& p) {
  return EvaluatePrefix(job, c, p.data(), job.workers());
}

Placement NaivePlacement(const JobShape& job) {
  Placement p(job.workers());
  std::iota(p.begin(), p.end(), 0);
  return p;
}

int64_t OrderedChoices(int n, int k) {
  if (k > n || k < 0) return 0;
  int64_t r = 1;
  for (int i = 0; i < k; ++i) {
    if (r > std::numeric_limits<int64_t>::max() / (n - i)) return std::numeric_limits<int64_t>::max();
    r *= n - i;
  }
  return r;
}

Solution SolveExact(const JobShape& job, const Cluster& c) {
  const int K = job.workers(), N = c.size(), S = job.stages;
  Solution best;
  best.exact = true;
  int64_t leaves = 0;
  if (N < K) {
    best.method = absl::StrCat("not enough workers: ", K, " needed, ", N, " given");
    return best;
  }
  best.placement = NaivePlacement(job);
  best.cost = Evaluate(job, c, best.placement);
  best.evaluated = 1;
  Placement cur(K);
  std::vector<char> used(N, 0);
  // Depth-first over positions; replicas are interchangeable, so their first stages' workers are
  // taken in increasing order (each placement is enumerated once, not D! times).
  auto dfs = [&](auto& self, int pos) -> void {
    if (pos == K) {
      ++leaves;
      const Cost x = Evaluate(job, c, cur);
      if (Better(x, best.cost)) std::tie(best.cost, best.placement) = std::pair(x, cur);
      return;
    }
    const int lo = pos >= S && pos % S == 0 ? cur[pos - S] + 1 : 0;
    for (int w = lo; w < N; ++w) {
      if (used[w]) continue;
      cur[pos] = w;
      if (pos + 1 < K && !(EvaluatePrefix(job, c, cur.data(), pos + 1).step_s < best.cost.step_s)) continue;
      used[w] = 1;
      self(self, pos + 1);
      used[w] = 0;
    }
  };
  dfs(dfs, 0);
  best.evaluated += leaves;
  int64_t all = OrderedChoices(N, K);
  for (int r = 2; r <= job.replicas; ++r) all /= r;
  best.method = absl::StrCat("exact search over the ", all, " placements on ", N, " workers (",
                             leaves < all ? absl::StrCat(leaves, " costed in full, the rest pruned") : "all costed", ")");
  return best;
}

Solution SolveHeuristic(const JobShape& job, const Cluster& c, const SolveOptions& o) {
  const int K = job.workers(), N = c.size();
  Solution out;
  if (N < K) {
    out.method = absl::StrCat("not enough workers: ", K, " needed, ", N, " given");
    return out;
  }
  Search search(job, c, o);
  std::vector<std::pair<Cost, Placement>> seeds;
  const Placement naive = NaivePlacement(job);
  seeds.emplace_back(search.Eval(naive), naive);
  // Greedy constructions from every worker as the first stage (at most 64 of them).
  std::vector<int> firsts(N);
  std::iota(firsts.begin(), firsts.end(), 0);
  if (N > 64) {
    std::mt19937_64 rng(o.seed);
    std::shuffle(firsts.begin(), firsts.end(), rng);
    firsts.resize(64);
  }
  for (int f : firsts) {
    if (search.OutOfTime()) break;
    Placement g = search.Greedy(f);
    seeds.emplace_back(search.Eval(g), std::move(g));
  }
  std::stable_sort(seeds.begin() + 1, seeds.end(),
                   [](const auto& a, const auto& b) { return Better(a.first, b.first); });
  if (seeds.size() > 4) seeds.resize(4);  // the naive order and the three best greedy ones
  if (job.replicas > 1) {  // and the two grouped constructions
    for (bool isolated_first : {true, false}) {
      if (search.OutOfTime()) break;
      Placement g = search.Grouped(isolated_first);
      if (!g.empty()) seeds.emplace_back(search.Eval(g), std::move(g));
    }
  }
  out.placement = naive;
  out.cost = seeds[0].first;
  for (auto& [cost, p] : seeds) {
    search.Descend(p, cost);
    if (Better(cost, out.cost)) std::tie(out.cost, out.placement) = std::pair(cost, p);
  }
  int rounds = 0;
  for (; rounds < o.rounds && !search.OutOfTime(); ++rounds) {
    Placement p = out.placement;
    search.Perturb(p);
    Cost cost = search.Eval(p);
    search.Descend(p, cost);
    if (Better(cost, out.cost)) std::tie(out.cost, out.placement) = std::pair(cost, p);
  }
  out.evaluated = search.evaluated();
  out.method = absl::StrCat("local search (greedy seeds, ", rounds, " perturbation rounds, ", out.evaluated,
                            " placements costed) over ", N, " workers");
  return out;
}

Solution Solve(const JobShape& job, const Cluster& c, const SolveOptions& o) {
  int64_t n = OrderedChoices(c.size(), job.workers());
  for (int r = 2; r <= job.replicas; ++r) n /= r;  // the replicas' symmetry
  return n <= o.exact_limit ? SolveExact(job, c) : SolveHeuristic(job, c, o);
}

}  // namespace longhaul::coordinator::placement
