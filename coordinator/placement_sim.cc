#include "coordinator/placement_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/replica_counts.h"
#include "coordinator/placement_counts.h"

namespace longhaul::coordinator::placement {
namespace {

// Delay (ms) and bandwidth (Gbit/s) between two regions.
struct RegionLink {
  double delay_ms, gbit;
};

struct Table {
  const char* name;
  const char* source;  // DT-FM's function in scheduler/heuristic_evolutionary_solver/config.py
  std::vector<std::string> regions;
  RegionLink inside;
  std::map<std::pair<std::string, std::string>, RegionLink> between;  // either order
};

// DS3Lab/DT-FM, scheduler/heuristic_evolutionary_solver/config.py: delay_bandwidth_dict for the
// worldwide case, the literal matrices of the other two (delays in ms, bandwidths in Gbit/s).
const std::vector<Table>& Tables() {
  static const std::vector<Table>* t = new std::vector<Table>{
      {"8-cities",
       "simulate_4_worldwide_geo_distributed",
       {"Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland"},
       {5, 2},
       {
           {{"Oregon", "Virginia"}, {67, 0.79}},    {{"Oregon", "Ohio"}, {49, 1.10}},
           {{"Oregon", "Tokyo"}, {96, 0.523}},      {{"Oregon", "Seoul"}, {124, 0.46}},
           {{"Oregon", "London"}, {136, 0.42}},     {{"Oregon", "Frankfurt"}, {143, 0.404}},
           {{"Oregon", "Ireland"}, {124, 0.482}},   {{"Virginia", "Ohio"}, {11, 1.12}},
           {{"Virginia", "Tokyo"}, {143, 0.524}},   {{"Virginia", "Seoul"}, {172, 0.500}},
           {{"Virginia", "London"}, {76, 1.16}},    {{"Virginia", "Frankfurt"}, {90, 1.02}},
           {{"Virginia", "Ireland"}, {67, 1.05}},   {{"Ohio", "Tokyo"}, {130, 0.694}},
           {{"Ohio", "Seoul"}, {159, 0.529}},       {{"Ohio", "London"}, {86, 1.05}},
           {{"Ohio", "Frankfurt"}, {99, 0.799}},    {{"Ohio", "Ireland"}, {77, 1.14}},
           {{"Tokyo", "Seoul"}, {34, 1.10}},        {{"Tokyo", "London"}, {210, 0.366}},
           {{"Tokyo", "Frankfurt"}, {223, 0.36}},   {{"Tokyo", "Ireland"}, {199, 0.465}},
           {{"Seoul", "London"}, {238, 0.342}},     {{"Seoul", "Frankfurt"}, {235, 0.358}},
           {{"Seoul", "Ireland"}, {228, 0.335}},    {{"London", "Frankfurt"}, {14, 1.14}},
           {{"London", "Ireland"}, {12, 1.09}},     {{"Frankfurt", "Ireland"}, {24, 1.08}},
       }},
      {"4-regions",
       "simulate_3_regional_geo_distributed",
       {"Virginia", "Oregon", "California", "Ohio"},
       {5, 2},
       {
           {{"Virginia", "Oregon"}, {67, 1.15}},
           {{"Virginia", "California"}, {59, 1.05}},
           {{"Virginia", "Ohio"}, {11, 1.12}},
           {{"Oregon", "California"}, {12, 1.25}},
           {{"Oregon", "Ohio"}, {49, 1.10}},
           {{"California", "Ohio"}, {52, 1.02}},
       }},
      {"2-regions", "simulate_2_multi_universities", {"Ohio", "Virginia"}, {1, 5}, {{{"Ohio", "Virginia"}, {11, 1.12}}}},
  };
  return *t;
}

Link ToLink(const RegionLink& r) { return {r.delay_ms / 2e3, r.gbit * 1e9 / 8}; }

}  // namespace

std::vector<std::string> SimulatedTopologyNames() {
  std::vector<std::string> out;
  for (const Table& t : Tables()) out.push_back(t.name);
  return out;
}

absl::StatusOr<SimTopology> SimulatedTopology(const std::string& name, int workers, double flops_per_s) {
  const Table* table = nullptr;
  for (const Table& t : Tables()) {
    if (t.name == name) table = &t;
  }
  if (table == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no simulated topology \"", name, "\" (", absl::StrJoin(SimulatedTopologyNames(), ", "), ")"));
  }
  if (workers < 1) return absl::InvalidArgumentError("a simulated topology needs at least 1 worker");
  const int R = static_cast<int>(table->regions.size());
  SimTopology out;
  out.name = name;
  out.description = absl::StrCat("DT-FM's ", table->source, " (DS3Lab/DT-FM, scheduler/heuristic_evolutionary_solver/config.py): ",
                                 absl::StrJoin(table->regions, ", "), "; inside a region ", table->inside.gbit,
                                 " Gbit/s and ", table->inside.delay_ms, " ms, between them DT-FM's table");
  out.cluster.flops_per_s.assign(workers, flops_per_s);
  out.cluster.links.assign(workers, std::vector<Link>(workers));
  std::vector<int> idx(workers);
  for (int i = 0; i < workers; ++i) {
    idx[i] = static_cast<int>(static_cast<int64_t>(i) * R / workers);
    out.region.push_back(table->regions[idx[i]]);
  }
  for (int i = 0; i < workers; ++i) {
    for (int j = 0; j < workers; ++j) {
      if (i == j) continue;
      if (idx[i] == idx[j]) {
        out.cluster.links[i][j] = ToLink(table->inside);
        continue;
      }
      auto it = table->between.find({out.region[i], out.region[j]});
      if (it == table->between.end()) it = table->between.find({out.region[j], out.region[i]});
      out.cluster.links[i][j] = ToLink(it->second);  // every pair is in the table
    }
  }
  return out;
}

namespace {

// Times `solve`, then costs the naive placement and o.random_placements random ones of `workers`
// workers with `evaluate`.
template <typename SolveFn, typename EvaluateFn>
SimResult Simulate(int workers, const Cluster& c, const SimOptions& o, const Placement& naive, SolveFn solve,
                   EvaluateFn evaluate) {
  SimResult r;
  const absl::Time t0 = absl::Now();
  r.solution = solve();
  r.solve_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.naive = evaluate(naive);
  std::mt19937_64 rng(o.seed);
  std::vector<int> all(c.size());
  std::iota(all.begin(), all.end(), 0);
  double sum = 0;
  r.random_best_s = 0;
  for (int i = 0; i < o.random_placements && workers <= c.size(); ++i) {
    std::shuffle(all.begin(), all.end(), rng);
    const Placement p(all.begin(), all.begin() + workers);
    const double step = evaluate(p).step_s;
    sum += step;
    r.random_best_s = i == 0 ? step : std::min(r.random_best_s, step);
    ++r.random_count;
  }
  if (r.random_count > 0) r.random_mean_s = sum / r.random_count;
  return r;
}

}  // namespace

SimResult SimulatePlan(const JobShape& job, const Cluster& c, const SimOptions& o) {
  SimResult r = Simulate(
      job.workers(), c, o, NaivePlacement(job), [&] { return Solve(job, c, o.solve); },
      [&](const Placement& p) { return Evaluate(job, c, p); });
  r.bound = LowerBound(job, c);
  return r;
}

SimResult SimulatePlanCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c,
                             const SimOptions& o) {
  const int workers = static_cast<int>(ReplicaSlots(counts).size());
  return Simulate(
      workers, c, o, NaiveCountsPlacement(counts), [&] { return SolveCounts(job, counts, c, o.solve); },
      [&](const Placement& p) { return EvaluateCounts(job, counts, c, p); });
}

// The per-group lower bound (placement.h), here beside the simulated plans that report it.
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The k-th smallest (1-based) of `v`, which it reorders; infinity when v holds fewer than k.
double KthSmallest(std::vector<double>& v, int k) {
  if (k < 1 || k > static_cast<int>(v.size())) return kInf;
  std::nth_element(v.begin(), v.begin() + (k - 1), v.end());
  return v[k - 1];
}

}  // namespace

Bound LowerBound(const JobShape& job, const Cluster& c) {
  const int S = job.stages, D = job.replicas, N = c.size();
  Bound b;
  if (N < job.workers() || S < 1 || D < 1) {
    b.step_s = b.period_s = kInf;
    return b;
  }
  const int K = job.workers();
  const int M = std::max(job.micro_batches, 1);
  const bool gpipe = job.schedule == Schedule::kGPipe;
  std::vector<double> v(N), any_stage(N, kInf), fastest(S, kInf), slowest_of_best(S, 0);
  // Stages: each needs D distinct workers, so the slowest of them is at best the D-th fastest; and
  // all K placed workers are distinct, so the slowest of all is at best the K-th fastest at
  // whichever stage suits it best.
  for (int s = 0; s < S; ++s) {
    for (int w = 0; w < N; ++w) {
      v[w] = c.flops_per_s[w] > 0 ? job.stage_flops[s] / c.flops_per_s[w] : kInf;
      fastest[s] = std::min(fastest[s], v[w]);
      any_stage[w] = std::min(any_stage[w], v[w]);
    }
    slowest_of_best[s] = KthSmallest(v, D);
    b.period_s = std::max(b.period_s, slowest_of_best[s]);
    b.fill_drain_s += fastest[s];
  }
  const double c_any = KthSmallest(any_stage, K);
  b.period_s = std::max(b.period_s, c_any);
  double cheapest_fill = 0, link_period = 0;
  if (S > 1) {
    // Links: D (S - 1) of them, each sent by a different worker (a worker holds one position).
    cheapest_fill = kInf;
    for (int i = 0; i < N; ++i) {
      v[i] = kInf;
      for (int j = 0; j < N; ++j) {
        if (j == i) continue;
        const Link& fw = c.links[i][j];
        const Link& bw = c.links[j][i];
        const double tf = Transfer(fw, job.activation_bytes), tb = Transfer(bw, job.gradient_bytes);
        v[i] = std::min(v[i], gpipe ? tf + tb : std::max(tf, tb));
        cheapest_fill = std::min(cheapest_fill, 2 * (fw.latency_s + bw.latency_s) + tf + tb);
      }
    }
    link_period = KthSmallest(v, D * (S - 1));
    b.period_s = std::max(b.period_s, link_period);
    b.fill_drain_s += (S - 1) * cheapest_fill;
  }
  const double M1 = M - 1;
  double pipeline;
  if (gpipe) {
    pipeline = Times(M1, b.period_s) + b.fill_drain_s;  // P_F + P_B >= every c_s and tf + tb
  } else {
    // 1F1B overlaps warm-up with the stages' own work: a link's M transfers have one micro-batch's
    // trip before and after them; a stage's M forwards and backwards only the stages before it.
    pipeline = std::max(Times(M1, link_period) + b.fill_drain_s, M * c_any);
    double before = 0;  // the cheapest fill and drain of the stages before k
    for (int k = 0; k < S; ++k) {
      pipeline = std::max(pipeline, M * slowest_of_best[k] + before);
      before += fastest[k] + cheapest_fill;
    }
  }
  b.fill_drain_s = std::isinf(pipeline) ? kInf : pipeline - Times(M1, b.period_s);
  if (D > 1) {
    // Replica groups: a member i pays at least the sum of its D - 1 cheapest pair costs (for the
    // stage's gradients) into `v`.
    std::vector<double> pair;
    auto member_costs = [&](double grad) {
      for (int i = 0; i < N; ++i) {
        pair.clear();
        for (int j = 0; j < N; ++j) {
          if (j != i) pair.push_back(2 * (c.links[i][j].latency_s + Transfer(c.links[i][j], grad / D)));
        }
        std::partial_sort(pair.begin(), pair.begin() + (D - 1), pair.end());
        v[i] = std::accumulate(pair.begin(), pair.begin() + (D - 1), 0.0);
      }
    };
    // A group's most loaded member: at least the D-th smallest over all workers. The K members of
    // all groups are distinct: the most loaded of them at least the K-th smallest for the
    // smallest stage's gradients.
    double least = kInf;
    for (int s = 0; s < S; ++s) {
      const double grad = s < static_cast<int>(job.stage_grad_bytes.size()) ? job.stage_grad_bytes[s] : 0.0;
      least = std::min(least, grad);
      member_costs(grad);
      b.dp_s = std::max(b.dp_s, KthSmallest(v, D));
    }
    member_costs(least);
    b.dp_s = std::max(b.dp_s, KthSmallest(v, K));
  }
  b.step_s = pipeline + b.dp_s;
  return b;
}

}  // namespace longhaul::coordinator::placement
