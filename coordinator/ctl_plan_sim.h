// `longhaulctl plan --simulate JOB.yaml`: the placement of a job on a simulated cluster (DT-FM's
// geo-distributed topologies, placement_sim.h) instead of the coordinator's live workers; no
// coordinator is needed and nothing is started. Prints the chosen placement (per stage, the
// regions of its replica group; per pipeline, its regions), the predicted step time beside the
// naive order's, random placements' (mean and best) and the per-group lower bound's, and the
// solve time; --json for scripts.
//
// The job's shape comes from the spec (job_cost.h's JobShapeOf) with D = --replicas data-parallel
// pipelines (default workers / stages, so that the whole cluster is used as in DT-FM); its
// `links:` emulation is ignored (the simulated topology is the network).
#ifndef LONGHAUL_COORDINATOR_CTL_PLAN_SIM_H_
#define LONGHAUL_COORDINATOR_CTL_PLAN_SIM_H_

#include <CLI/CLI.hpp>

#include "coordinator/ctl_links.h"

namespace longhaul::coordinator {

// Adds --simulate and the options that go with it to `plan`.
void AddPlanSimulationFlags(CLI::App* plan, PlanFlags* flags);

// Returns the exit status (0; 1 with the reason on stderr).
int RunPlanSimulation(const PlanFlags& flags);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_CTL_PLAN_SIM_H_
