// `longhaulctl links` (the coordinator's link matrix: Mbit/s, RTT and age of every directed pair
// of live workers, and each worker's compute speed) and `longhaulctl plan JOB.yaml` (where the
// job would be placed now, its predicted step time and the naive order's, nothing started;
// `plan --simulate` plans on a simulated topology instead, without a coordinator: ctl_plan_sim.h).
// Kept out of ctl_main.cc so that the CLI's main stays a list of commands.
//
//   LinksFlags lf;  CLI::App* links = AddLinksCommand(app, &lf);
//   PlanFlags pf;   CLI::App* plan = AddPlanCommand(app, &pf);
//   ... parse ...
//   if (links->parsed()) return RunLinks(coordinator_address, lf);
#ifndef LONGHAUL_COORDINATOR_CTL_LINKS_H_
#define LONGHAUL_COORDINATOR_CTL_LINKS_H_

#include <string>

#include <CLI/CLI.hpp>

namespace longhaul::coordinator {

struct LinksFlags {
  bool json = false;
};

struct PlanFlags {
  std::string spec;  // the job spec's path
  bool json = false;
  // --simulate: no coordinator; the job on a simulated topology (ctl_plan_sim.h).
  bool simulate = false;
  std::string topology = "8-cities";
  int workers = 64;
  int replicas = 0;           // 0: workers / stages
  double gflops = 100000;     // each simulated worker's benchmark speed
  int random = 1000;          // random placements to compare with
  double time_limit_s = 5;    // the heuristic's wall-time limit
  uint64_t seed = 1;
};

CLI::App* AddLinksCommand(CLI::App& app, LinksFlags* flags);
CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* flags);

// Run against the coordinator at `coordinator` (HOST:PORT); return the exit status (0 on success,
// 1 with the reason on stderr otherwise).
int RunLinks(const std::string& coordinator, const LinksFlags& flags);
int RunPlan(const std::string& coordinator, const PlanFlags& flags);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_CTL_LINKS_H_
