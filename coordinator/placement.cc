#include "coordinator/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::coordinator::placement {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Seconds to push `bytes` through a link, latency excluded; an unusable link takes forever.
double Transfer(const Link& l, double bytes) {
  if (bytes <= 0) return 0;
  return l.bytes_per_s > 0 ? bytes / l.bytes_per_s : kInf;
}

// The cost of the placed prefix p[0..n): for n == job.workers() the placement's cost, for a
// shorter prefix a lower bound of every completion's, since every term (a maximum or a sum of
// non-negative times) only grows as stages are added. The exact search prunes on it.
Cost EvaluatePrefix(const JobShape& job, const Cluster& c, const int* p, int n) {
  const int S = job.stages;
  const int D = job.replicas;
  const double M1 = std::max(job.micro_batches, 1) - 1;
  Cost out;
  double worst = -1;
  for (int r = 0; r < D && r * S < n; ++r) {
    const int base = r * S;
    const int placed = std::min(S, n - base);
    double period = 0, fill = 0, norm = 0, work = 0;
    Cost::Limit limit = Cost::Limit::kCompute;
    int limit_stage = 0;
    for (int s = 0; s < placed; ++s) {
      const int w = p[base + s];
      const double flops = c.flops_per_s[w];
      const double cs = flops > 0 ? job.stage_flops[s] / flops : kInf;
      fill += cs;
      work += cs;
      if (cs > period) std::tie(period, limit, limit_stage) = std::tuple(cs, Cost::Limit::kCompute, s);
      if (s + 1 >= placed) continue;
      const int v = p[base + s + 1];
      const Link& fw = c.links[w][v];
      const Link& bw = c.links[v][w];
      const double tf = Transfer(fw, job.activation_bytes);
      const double tb = Transfer(bw, job.gradient_bytes);
      fill += fw.latency_s + tf + bw.latency_s + tb;
      norm += fw.latency_s + bw.latency_s;
      work += tf + tb;
      if (tf > period) std::tie(period, limit, limit_stage) = std::tuple(tf, Cost::Limit::kLinkForward, s);
      if (tb > period) std::tie(period, limit, limit_stage) = std::tuple(tb, Cost::Limit::kLinkBackward, s);
    }
    const double t = M1 * period + fill + norm;
    out.tiebreak += work;
    if (t > worst) {
      worst = t;
      out.period_s = period;
      out.fill_drain_s = fill + norm;
      out.limit = limit;
      out.limit_replica = r;
      out.limit_stage = limit_stage;
    }
  }
  double dp = 0;
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
      }
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

// Local search and its moves over one placement. The moves keep the placement valid: a swap of
// two positions, an unused worker in place of a used one, a pipeline's segment reversed (which
// turns its links around) or one stage moved elsewhere in its pipeline.
class Search {
 public:
  Search(const JobShape& job, const Cluster& c, const SolveOptions& o)
      : job_(job), c_(c), K_(job.workers()), N_(c.size()), o_(o), rng_(o.seed), start_(absl::Now()) {}

  int64_t evaluated() const { return evaluated_; }
  bool OutOfTime() const { return absl::Now() - start_ > o_.time_limit; }

  Cost Eval(const Placement& p) {
    ++evaluated_;
    return EvaluatePrefix(job_, c_, p.data(), K_);
  }

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
      improved = false;
      auto keep = [&](auto undo) {
        const Cost x = Eval(p);
        if (Better(x, cost)) {
          cost = x;
          improved = true;
        } else {
          undo();
        }
      };
      for (int i = 0; i < K_; ++i) {
        for (int j = i + 1; j < K_; ++j) {
          std::swap(p[i], p[j]);
          keep([&] { std::swap(p[i], p[j]); });
        }
      }
      std::vector<char> used(N_, 0);
      for (int w : p) used[w] = 1;
      for (int i = 0; i < K_; ++i) {
        for (int u = 0; u < N_; ++u) {
          if (used[u]) continue;
          const int old = p[i];
          p[i] = u;
          const Cost x = Eval(p);
          if (Better(x, cost)) {
            cost = x;
            improved = true;
            used[old] = 0;
            used[u] = 1;
          } else {
            p[i] = old;
          }
        }
      }
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

  // A few random swaps or replacements: a kick out of the current local optimum.
  void Perturb(Placement& p) {
    std::vector<int> unused;
    std::vector<char> used(N_, 0);
    for (int w : p) used[w] = 1;
    for (int w = 0; w < N_; ++w) {
      if (!used[w]) unused.push_back(w);
    }
    const int moves = 2 + static_cast<int>(rng_() % 3);
    for (int m = 0; m < moves; ++m) {
      const int i = static_cast<int>(rng_() % K_);
      if (!unused.empty() && rng_() % 3 == 0) {
        std::swap(p[i], unused[rng_() % unused.size()]);
      } else if (K_ > 1) {
        std::swap(p[i], p[rng_() % K_]);
      }
    }
  }

 private:
  const JobShape& job_;
  const Cluster& c_;
  const int K_, N_;
  const SolveOptions& o_;
  std::mt19937_64 rng_;
  const absl::Time start_;
  int64_t evaluated_ = 0;
};

}  // namespace

bool Better(const Cost& a, const Cost& b) {
  if (!Within(a.step_s, b.step_s)) return a.step_s < b.step_s;
  return !Within(a.tiebreak, b.tiebreak) && a.tiebreak < b.tiebreak;
}

Cost Evaluate(const JobShape& job, const Cluster& c, const Placement& p) {
  return EvaluatePrefix(job, c, p.data(), job.workers());
}

std::vector<StageCost> StageCosts(const JobShape& job, const Cluster& c, const Placement& p, int replica) {
  std::vector<StageCost> out(job.stages);
  const int base = replica * job.stages;
  for (int s = 0; s < job.stages; ++s) {
    const int w = p[base + s];
    out[s].compute_s = c.flops_per_s[w] > 0 ? job.stage_flops[s] / c.flops_per_s[w] : kInf;
    if (s + 1 == job.stages) continue;
    const int v = p[base + s + 1];
    out[s].forward_s = c.links[w][v].latency_s + Transfer(c.links[w][v], job.activation_bytes);
    out[s].backward_s = c.links[v][w].latency_s + Transfer(c.links[v][w], job.gradient_bytes);
  }
  return out;
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
