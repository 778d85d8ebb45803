#include "coordinator/placement_sim.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

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

SimResult SimulatePlan(const JobShape& job, const Cluster& c, const SimOptions& o) {
  SimResult r;
  const absl::Time t0 = absl::Now();
  r.solution = Solve(job, c, o.solve);
  r.solve_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.naive = Evaluate(job, c, NaivePlacement(job));
  std::mt19937_64 rng(o.seed);
  std::vector<int> all(c.size());
  std::iota(all.begin(), all.end(), 0);
  double sum = 0;
  r.random_best_s = 0;
  for (int i = 0; i < o.random_placements; ++i) {
    std::shuffle(all.begin(), all.end(), rng);
    const Placement p(all.begin(), all.begin() + job.workers());
    const double step = Evaluate(job, c, p).step_s;
    sum += step;
    r.random_best_s = i == 0 ? step : std::min(r.random_best_s, step);
    ++r.random_count;
  }
  if (r.random_count > 0) r.random_mean_s = sum / r.random_count;
  r.bound = LowerBound(job, c);
  return r;
}

}  // namespace longhaul::coordinator::placement
