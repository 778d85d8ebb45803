#include "coordinator/ctl_plan_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/read_file.h"
#include "coordinator/job_cost.h"
#include "coordinator/job_spec.h"
#include "coordinator/placement.h"
#include "coordinator/placement_sim.h"
#include "proto/link_spec.h"
#include "proto/replica_layout.h"

namespace longhaul::coordinator {
namespace {

namespace pl = placement;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "longhaulctl: %s\n", msg.c_str());
  return 1;
}

std::string Sec(double s) {
  if (!std::isfinite(s)) return "forever";
  return s < 1 ? absl::StrFormat("%.3g ms", s * 1e3) : absl::StrFormat("%.3f s", s);
}

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.2f MB", b / 1e6);
  return absl::StrFormat("%.1f kB", b / 1e3);
}

// "Oregon x8, Virginia x8": the regions of some workers, in order of first appearance.
std::string RegionCounts(const std::vector<int>& workers, const std::vector<std::string>& region) {
  std::vector<std::pair<std::string, int>> counts;
  for (int w : workers) {
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == region[w]; });
    if (it == counts.end()) {
      counts.emplace_back(region[w], 1);
    } else {
      ++it->second;
    }
  }
  std::vector<std::string> parts;
  for (const auto& [r, n] : counts) parts.push_back(absl::StrCat(r, " x", n));
  return absl::StrJoin(parts, ", ");
}

std::string Worker(int w, const std::vector<std::string>& region) { return absl::StrCat("w", w, " (", region[w], ")"); }

std::string DescribeLimit(const pl::JobShape& job, const pl::Placement& p, const pl::Cost& c,
                          const std::vector<std::string>& region) {
  const int base = c.limit_replica * job.stages, s = c.limit_stage;
  std::string out;
  switch (c.limit) {
    case pl::Cost::Limit::kCompute:
      out = absl::StrCat("stage ", s, "'s compute on ", Worker(p[base + s], region));
      break;
    case pl::Cost::Limit::kLinkForward:
      out = absl::StrCat("activations on the link ", Worker(p[base + s], region), " -> ",
                         Worker(p[base + s + 1], region));
      break;
    case pl::Cost::Limit::kLinkBackward:
      out = absl::StrCat("gradients on the link ", Worker(p[base + s + 1], region), " -> ",
                         Worker(p[base + s], region));
      break;
  }
  return absl::StrCat(out, " (replica ", c.limit_replica, ", stage ", s, ")");
}

// The JSON output's keys that both kinds of plan have.
nlohmann::json CommonJson(const PlanFlags& flags, const pl::SimTopology& topo, const pl::JobShape& job,
                          const pl::SimResult& r, const std::string& note) {
  return {{"topology", topo.name},
          {"topology_description", topo.description},
          {"workers", flags.workers},
          {"worker_regions", topo.region},
          {"gflops", flags.gflops},
          {"stages", job.stages},
          {"micro_batches", job.micro_batches},
          {"schedule", pl::ScheduleName(job.schedule)},
          {"placement", r.solution.method},
          {"predicted_step_seconds", r.solution.cost.step_s},
          {"dp_seconds", r.solution.cost.dp_s},
          {"naive_step_seconds", r.naive.step_s},
          {"random", {{"count", r.random_count}, {"seed", flags.seed}, {"mean_step_seconds", r.random_mean_s},
                      {"best_step_seconds", r.random_best_s}}},
          {"solve_seconds", r.solve_seconds},
          {"note", note}};
}

// The text output's end: the naive order, the random placements, `bound_line`, the solver's time.
void PrintComparisons(const PlanFlags& flags, const pl::SimResult& r, const std::string& bound_line,
                      const std::string& note) {
  const double step = r.solution.cost.step_s;
  std::printf("naive order (w0..w%zu by id): %s (%.2fx the chosen placement's)\n", r.solution.placement.size() - 1,
              Sec(r.naive.step_s).c_str(), r.naive.step_s / step);
  std::printf("random placements (%d, seed %llu): mean %s (%.2fx), best %s (%.2fx)\n", r.random_count,
              static_cast<unsigned long long>(flags.seed), Sec(r.random_mean_s).c_str(), r.random_mean_s / step,
              Sec(r.random_best_s).c_str(), r.random_best_s / step);
  std::printf("%s", bound_line.c_str());
  std::printf("solved in %.3f s\n", r.solve_seconds);
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  std::printf("nothing was started\n");
}

// What limits a per-stage-count plan: placement_counts.h names the busy slot (the sender of a link).
std::string DescribeCountsLimit(const std::vector<int>& counts, const pl::Placement& p, const pl::Cost& c,
                                const std::vector<std::string>& region) {
  const int s = c.limit_stage, r = c.limit_replica;
  const std::string w = Worker(p[SlotOf(counts, s, r)], region);
  const std::string slot = absl::StrCat(" (stage ", s, ", replica ", r, ")");
  switch (c.limit) {
    case pl::Cost::Limit::kCompute: return absl::StrCat("the compute on ", w, slot);
    case pl::Cost::Limit::kLinkForward: return absl::StrCat("the activations ", w, slot, " sends to stage ", s + 1);
    case pl::Cost::Limit::kLinkBackward: break;
  }
  return absl::StrCat("the gradients ", w, slot, " sends to stage ", s - 1);
}

// `plan --simulate` for a spec whose stages have different replica counts (placement_counts.h).
int RunCountsSimulation(const PlanFlags& flags, const v1::JobSpec& spec, const pl::JobShape& job,
                        const std::vector<int>& counts, const pl::SimTopology& topo, const pl::SimOptions& o,
                        const std::string& note) {
  const pl::SimResult r = pl::SimulatePlanCounts(job, counts, topo.cluster, o);
  const pl::Placement& p = r.solution.placement;
  if (p.empty()) return Fail(r.solution.method);
  const std::vector<std::string>& region = topo.region;
  const int S = job.stages;
  auto group = [&](int s) {
    std::vector<int> g;
    for (int rep = 0; rep < counts[s]; ++rep) g.push_back(p[SlotOf(counts, s, rep)]);
    return g;
  };
  const pl::Cost& c = r.solution.cost;
  if (flags.json) {
    nlohmann::json stages = nlohmann::json::array();
    for (int s = 0; s < S; ++s) {
      nlohmann::json ws = nlohmann::json::array();
      for (int w : group(s)) ws.push_back({{"worker", w}, {"region", region[w]}});
      stages.push_back(ws);
    }
    nlohmann::json out = CommonJson(flags, topo, job, r, note);
    out["stage_replicas"] = counts;
    out["stage_workers"] = stages;
    out["bottleneck"] = DescribeCountsLimit(counts, p, c, region);
    out["lower_bound"] = nullptr;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("simulated cluster: %d workers, %s\n", flags.workers, topo.description.c_str());
  std::printf("job: %s: %s, %d micro-batch(es) per step, %s\n", spec.name().c_str(), DescribeStages(spec).c_str(),
              job.micro_batches, pl::ScheduleName(job.schedule));
  std::printf("placement: %s\n", r.solution.method.c_str());
  for (int s = 0; s < S; ++s) {
    std::vector<std::string> ws;
    for (int w : group(s)) ws.push_back(Worker(w, region));
    std::printf("  stage %d (%d micro-batch(es) a replica): %s\n", s, ShareOf(counts, job.micro_batches, s),
                absl::StrJoin(ws, ", ").c_str());
  }
  std::printf("predicted step time: %s\n", Sec(c.step_s).c_str());
  std::printf("  pipeline %s (its period set by %s) + data-parallel sync %s\n", Sec(c.step_s - c.dp_s).c_str(),
              DescribeCountsLimit(counts, p, c, region).c_str(), Sec(c.dp_s).c_str());
  PrintComparisons(flags, r, "no per-group lower bound: it is for identical pipelines, and these stages' replica "
                             "counts differ\n", note);
  return 0;
}

}  // namespace

void AddPlanSimulationFlags(CLI::App* plan, PlanFlags* flags) {
  CLI::Option* sim = plan->add_flag(
      "--simulate", flags->simulate,
      "plan on a simulated cluster (DT-FM's geo-distributed topologies) instead of the coordinator's\n"
      "workers: no coordinator needed; compares with random placements and a lower bound");
  plan->add_option("--topology", flags->topology, "with --simulate: the simulated network")
      ->check(CLI::IsMember(pl::SimulatedTopologyNames()))
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--workers", flags->workers, "with --simulate: simulated workers, in contiguous blocks per region")
      ->check(CLI::Range(1, 512))
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--replicas", flags->replicas,
                   "with --simulate: data-parallel pipelines (0: a spec's per-stage list of differing "
                   "replica counts, else workers / stages, the whole cluster)")
      ->check(CLI::Range(0, 512))
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--gflops", flags->gflops,
                   "with --simulate: each worker's matrix-product speed (GFLOP/s; stages reach x0.6 of it)")
      ->check(CLI::PositiveNumber)
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--random", flags->random, "with --simulate: random placements to compare with")
      ->check(CLI::Range(1, 1000000))
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--time-limit", flags->time_limit_s, "with --simulate: the solver's wall-time limit (seconds)")
      ->check(CLI::Range(0.01, 600.0))
      ->needs(sim)
      ->capture_default_str();
  plan->add_option("--seed", flags->seed, "with --simulate: seeds the solver and the random placements")
      ->needs(sim)
      ->capture_default_str();
}

int RunPlanSimulation(const PlanFlags& flags) {
  absl::StatusOr<std::string> yaml = common::ReadFile(flags.spec);
  if (!yaml.ok()) return Fail(std::string(yaml.status().message()));
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(*yaml);
  if (!spec.ok()) {
    std::fprintf(stderr, "longhaulctl: %s was rejected:\n", flags.spec.c_str());
    std::istringstream lines(std::string(spec.status().message()));
    for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "  - %s\n", line.c_str());
    return 1;
  }
  absl::StatusOr<pl::JobShape> shape = JobShapeOf(*spec);
  if (!shape.ok()) return Fail(absl::StrCat("the cost model cannot take ", flags.spec, ": ", shape.status().message()));
  pl::JobShape job = *shape;
  const int S = job.stages;
  // The spec's per-stage counts unless --replicas overrides them.
  const std::vector<int> counts = flags.replicas == 0 && ReplicaCountsDiffer(*spec) ? ReplicaCounts(*spec) : std::vector<int>();
  if (!counts.empty() && WorkersNeeded(*spec) > flags.workers) {
    return Fail(absl::StrCat("the job needs ", WorkersNeeded(*spec), " workers (", DescribeStages(*spec),
                             "), the simulated cluster has ", flags.workers, " (--workers)"));
  }
  job.replicas = flags.replicas > 0 ? flags.replicas : flags.workers / S;
  if (counts.empty() && (job.replicas < 1 || job.workers() > flags.workers)) {
    return Fail(absl::StrCat("the job needs ", S, " x ", std::max(job.replicas, 1), " workers, the simulated cluster has ",
                             flags.workers, " (--workers, --replicas)"));
  }
  absl::StatusOr<pl::SimTopology> topo =
      pl::SimulatedTopology(flags.topology, flags.workers, flags.gflops * 1e9 * kComputeEfficiency);
  if (!topo.ok()) return Fail(std::string(topo.status().message()));
  pl::SimOptions o;
  o.solve.time_limit = absl::Milliseconds(static_cast<int64_t>(flags.time_limit_s * 1e3));
  o.solve.seed = flags.seed;
  o.seed = flags.seed;
  o.random_placements = flags.random;
  const bool links_set = EmulatesLink(spec->links()) || spec->links().pace_mbit() > 0;
  const std::string note =
      links_set ? "the spec's links: emulation is ignored, and so is its pace (the simulated topology is the network)" : "";
  if (!counts.empty()) return RunCountsSimulation(flags, *spec, job, counts, *topo, o, note);
  const pl::SimResult r = pl::SimulatePlan(job, topo->cluster, o);
  const pl::Placement& p = r.solution.placement;
  if (p.empty()) return Fail(r.solution.method);
  const std::vector<std::string>& region = topo->region;
  const int D = job.replicas;
  auto group = [&](int s) {
    std::vector<int> g;
    for (int rep = 0; rep < D; ++rep) g.push_back(p[rep * S + s]);
    return g;
  };
  int inside = 0, between = 0;
  for (int rep = 0; rep < D; ++rep) {
    for (int s = 0; s + 1 < S; ++s) (region[p[rep * S + s]] == region[p[rep * S + s + 1]] ? inside : between)++;
  }
  const pl::Cost& c = r.solution.cost;

  if (flags.json) {
    nlohmann::json pipelines = nlohmann::json::array();
    for (int rep = 0; rep < D; ++rep) {
      nlohmann::json ws = nlohmann::json::array();
      for (int s = 0; s < S; ++s) ws.push_back({{"worker", p[rep * S + s]}, {"region", region[p[rep * S + s]]}});
      pipelines.push_back(ws);
    }
    nlohmann::json out = CommonJson(flags, *topo, job, r, note);
    out["replicas"] = D;
    out["pipelines"] = pipelines;
    out["pipeline_links_inside_regions"] = inside;
    out["pipeline_links_between_regions"] = between;
    out["period_seconds"] = c.period_s;
    out["fill_drain_seconds"] = c.fill_drain_s;
    out["bottleneck"] = DescribeLimit(job, p, c, region);
    out["lower_bound"] = {{"step_seconds", r.bound.step_s}, {"period_seconds", r.bound.period_s},
                          {"fill_drain_seconds", r.bound.fill_drain_s}, {"dp_seconds", r.bound.dp_s}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("simulated cluster: %d workers, %s\n", flags.workers, topo->description.c_str());
  std::vector<std::string> blocks;
  for (int i = 0; i < flags.workers;) {
    int j = i;
    while (j + 1 < flags.workers && region[j + 1] == region[i]) ++j;
    blocks.push_back(absl::StrCat(region[i], " w", i, i == j ? "" : absl::StrCat("-w", j)));
    i = j + 1;
  }
  std::printf("  by worker id: %s; each %.0f GFLOP/s (stages reach x%.1f of it)\n", absl::StrJoin(blocks, ", ").c_str(),
              flags.gflops, kComputeEfficiency);
  std::printf("job: %s: %d stage(s) x %d data-parallel pipeline(s), %d micro-batch(es) per step, %s\n",
              spec->name().c_str(), S, D, job.micro_batches, pl::ScheduleName(job.schedule));
  std::printf("  per micro-batch: activations %s and gradients %s on each link; stage 0 computes %s\n",
              Bytes(job.activation_bytes).c_str(), Bytes(job.gradient_bytes).c_str(),
              Sec(job.stage_flops[0] / topo->cluster.flops_per_s[0]).c_str());
  if (D > 1) std::printf("  per step: stage 0's replicas sync %s of gradients\n", Bytes(job.stage_grad_bytes[0]).c_str());
  std::printf("placement: %s\n", r.solution.method.c_str());
  for (int s = 0; s < S; ++s) std::printf("  stage %d on %s\n", s, RegionCounts(group(s), region).c_str());
  if (S > 1) {
    std::printf("  pipeline links: %d inside a region, %d between regions\n", inside, between);
    const int shown = std::min(D, 8);
    for (int rep = 0; rep < shown; ++rep) {
      std::vector<std::string> ws;
      for (int s = 0; s < S; ++s) ws.push_back(Worker(p[rep * S + s], region));
      std::printf("  pipeline %d: %s\n", rep, absl::StrJoin(ws, " -> ").c_str());
    }
    if (shown < D) std::printf("  (%d more pipelines: --json lists them all)\n", D - shown);
  }
  std::printf("predicted step time: %s\n", Sec(c.step_s).c_str());
  std::printf("  pipeline %s (%d x period %s + fill and drain %s)%s\n", Sec(c.step_s - c.dp_s).c_str(),
              job.micro_batches - 1, Sec(c.period_s).c_str(), Sec(c.fill_drain_s).c_str(),
              D > 1 ? absl::StrCat(" + data-parallel sync ", Sec(c.dp_s)).c_str() : "");
  std::printf("  limited by %s\n", DescribeLimit(job, p, c, region).c_str());
  PrintComparisons(flags, r,
                   absl::StrFormat("per-group lower bound: %s (the chosen placement is %.2fx it; every stage, link and "
                                   "replica group\n  on its own best workers, chosen independently: docs/placement.md)\n",
                                   Sec(r.bound.step_s), c.step_s / r.bound.step_s),
                   note);
  return 0;
}

}  // namespace longhaul::coordinator
