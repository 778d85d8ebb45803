// Simulated clusters for the placement (`longhaulctl plan --simulate`): DT-FM's geo-distributed
// topologies, and one run of the solver on a job with what it is compared against -- the naive
// order, random placements and the per-group lower bound (placement.h's LowerBound; with
// per-stage replica counts, placement_counts.h's solver and no bound). Plain C++,
// no LibTorch and no coordinator.
//
//   absl::StatusOr<SimTopology> t = SimulatedTopology("8-cities", 64, 1e14);
//   SimResult r = SimulatePlan(job, t->cluster, {});
//
// The topologies are DT-FM's (DS3Lab/DT-FM, scheduler/heuristic_evolutionary_solver/config.py,
// simulate_2_multi_universities, simulate_3_regional_geo_distributed and
// simulate_4_worldwide_geo_distributed): per pair of regions a delay in ms and a bandwidth in
// Gbit/s, the same inside every region; worker i is in region i R / N (contiguous blocks, as
// DT-FM's i // 8). DT-FM adds the delay once per message as its alpha; we read the delays as round
// trips (Oregon-Virginia's 67 ms is a ping's order between those regions), and this model's alpha
// is a one-way latency (half of a measured RTT, job_cost.h), so alpha = delay / 2 here.
//
// Thread safety: pure functions.
#ifndef LONGHAUL_COORDINATOR_PLACEMENT_SIM_H_
#define LONGHAUL_COORDINATOR_PLACEMENT_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/placement.h"

namespace longhaul::coordinator::placement {

struct SimTopology {
  std::string name;                  // e.g. "8-cities"
  std::string description;           // one line: where it comes from, the links inside regions
  std::vector<std::string> region;   // per worker
  Cluster cluster;
};

// "8-cities" (DT-FM's worldwide case: Oregon, Virginia, Ohio, Tokyo, Seoul, London, Frankfurt,
// Ireland), "4-regions" (its regional case: Virginia, Oregon, California, Ohio), "2-regions" (its
// two universities: Ohio and Virginia).
std::vector<std::string> SimulatedTopologyNames();

// `workers` >= 1 workers, each computing at `flops_per_s` (what its stages achieve).
absl::StatusOr<SimTopology> SimulatedTopology(const std::string& name, int workers, double flops_per_s);

struct SimOptions {
  SolveOptions solve;
  int random_placements = 1000;  // random placements costed for the comparison
  uint64_t seed = 1;             // theirs (the solver's is solve.seed)
};

struct SimResult {
  Solution solution;
  double solve_seconds = 0;
  Cost naive;
  int random_count = 0;
  double random_mean_s = 0;  // mean predicted step of the random placements
  double random_best_s = 0;  // the best of them
  Bound bound;
};

// Solves `job` on `c` (placement.h's Solve) and costs the naive order, `random_placements` random
// ones (uniform ordered choices of job.workers() workers) and the lower bound. c.size() must be at
// least job.workers().
SimResult SimulatePlan(const JobShape& job, const Cluster& c, const SimOptions& o);

// The same for a job whose stages have different replica counts (placement_counts.h: SolveCounts,
// and EvaluateCounts for the naive order and the random placements of the sum of `counts`
// workers). No lower bound (`bound` stays zero): placement.h's is for identical pipelines.
SimResult SimulatePlanCounts(const JobShape& job, const std::vector<int>& counts, const Cluster& c,
                             const SimOptions& o);

}  // namespace longhaul::coordinator::placement

#endif  // LONGHAUL_COORDINATOR_PLACEMENT_SIM_H_
