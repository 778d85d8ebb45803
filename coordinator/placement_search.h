// The local search every placement solver shares (internal to longhaul_placement): placement.cc's
// for D identical pipelines adds its own moves and seeds, placement_counts.cc's for differing
// replica counts uses these alone. A placement assigns one distinct worker (of `workers`) to each
// of `slots` positions; every move keeps it so: a swap of two positions' workers, an unused worker
// in place of a used one. The cost of a placement is the caller's Evaluator.
//
// Thread safety: one search per thread.
#ifndef LONGHAUL_COORDINATOR_PLACEMENT_SEARCH_H_
#define LONGHAUL_COORDINATOR_PLACEMENT_SEARCH_H_

#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/placement.h"

namespace longhaul::coordinator::placement {

class LocalSearch {
 public:
  using Evaluator = std::function<Cost(const Placement&)>;

  LocalSearch(int slots, int workers, const SolveOptions& o, Evaluator eval)
      : K_(slots), N_(workers), o_(o), eval_(std::move(eval)), rng_(o.seed), start_(absl::Now()) {}

  int64_t evaluated() const { return evaluated_; }
  bool OutOfTime() const { return absl::Now() - start_ > o_.time_limit; }

  Cost Eval(const Placement& p) {
    ++evaluated_;
    return eval_(p);
  }

  // Costs `p` after a move: keeps it when it is better than `cost` (which it then becomes), else
  // calls `undo`. True when kept.
  template <typename Undo>
  bool Keep(const Placement& p, Cost& cost, Undo undo) {
    const Cost x = Eval(p);
    if (Better(x, cost)) {
      cost = x;
      return true;
    }
    undo();
    return false;
  }

  // One pass over every swap of two positions' workers, then every replacement of a position's
  // worker by an unused one, keeping each that improves. True when one did.
  bool SwapsAndReplacements(Placement& p, Cost& cost) {
    bool improved = false;
    for (int i = 0; i < K_; ++i) {
      for (int j = i + 1; j < K_; ++j) {
        std::swap(p[i], p[j]);
        improved |= Keep(p, cost, [&] { std::swap(p[i], p[j]); });
      }
    }
    std::vector<char> used(N_, 0);
    for (int w : p) used[w] = 1;
    for (int i = 0; i < K_; ++i) {
      for (int u = 0; u < N_; ++u) {
        if (used[u]) continue;
        const int old = p[i];
        p[i] = u;
        if (Keep(p, cost, [&] { p[i] = old; })) {
          improved = true;
          used[old] = 0;
          used[u] = 1;
        }
      }
    }
    return improved;
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
  const int K_, N_;
  const SolveOptions& o_;
  const Evaluator eval_;
  std::mt19937_64 rng_;
  const absl::Time start_;
  int64_t evaluated_ = 0;
};

}  // namespace longhaul::coordinator::placement

#endif  // LONGHAUL_COORDINATOR_PLACEMENT_SEARCH_H_
