// Placement of jobs whose stages have different replica counts (coordinator/placement_counts.h):
// the recurrence on a hand-computed fan-in, agreement with placement.h's 1F1B model when the counts
// are equal, and a solver that keeps the stage every replica streams to off a slow worker.
#include "coordinator/placement_counts.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

namespace longhaul::coordinator::placement {
namespace {

Cluster Uniform(int n, double flops, Link l) {
  Cluster c;
  c.flops_per_s.assign(n, flops);
  c.links.assign(n, std::vector<Link>(n, l));
  return c;
}

JobShape Shape(int stages, int micro_batches, double flops_per_stage, double act, double grad) {
  JobShape j;
  j.stages = stages;
  j.micro_batches = micro_batches;
  j.stage_flops.assign(stages, flops_per_stage);
  j.activation_bytes = act;
  j.gradient_bytes = grad;
  j.stage_grad_bytes.assign(stages, 0);
  return j;
}

// replicas [2, 1], 4 micro-batches, 1F1B, every operation's compute 1/3 (forward) or 2/3
// (backward), links free. Stage 1's one worker runs all four micro-batches in order (F0 B0 F1 B1
// ...: done at 13/3); replica 1 of stage 0 (micro-batches 2 and 3) waits for its gradients until
// then: B of micro-batch 3 starts at 13/3 and ends at 5.
TEST(PlacementCounts, FanInOnHandComputedTimes) {
  const JobShape job = Shape(2, 4, 1, 0, 0);
  const Cluster c = Uniform(3, 1, {0, 1e9});
  const Cost x = EvaluateCounts(job, {2, 1}, c, NaiveCountsPlacement({2, 1}));
  EXPECT_NEAR(x.step_s, 5.0, 1e-12);
  EXPECT_EQ(x.dp_s, 0);  // stage 0's replicas sync nothing (no gradient bytes, no latency)
  // The busiest resource: stage 1's worker, 4 micro-batches of 1.
  EXPECT_EQ(x.limit, Cost::Limit::kCompute);
  EXPECT_EQ(x.limit_stage, 1);
  EXPECT_NEAR(x.period_s, 1.0, 1e-12);
  EXPECT_NEAR(x.fill_drain_s, 2.0, 1e-12);
}

// With one count for every stage the job is D identical pipelines: the same prediction as
// placement.h's model (1F1B: its recurrence per pipeline, the norm's latencies, DT-FM's sync;
// the norm as below).
TEST(PlacementCounts, EqualCountsAgreeWithThePipelineModel) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 50; ++t) {
    const int S = 1 + static_cast<int>(rng() % 4), D = 1 + static_cast<int>(rng() % 3);
    const int m = 1 + static_cast<int>(rng() % 5);
    JobShape job = Shape(S, m * D, 0, (0.2 + u(rng)) * 4e6, (0.1 + u(rng)) * 4e6);
    for (double& f : job.stage_flops) f = (0.5 + u(rng)) * 2e9;
    for (double& g : job.stage_grad_bytes) g = (0.5 + u(rng)) * 4e7;
    Cluster c;
    const int n = S * D + 2;
    c.flops_per_s.resize(n);
    for (double& f : c.flops_per_s) f = (10 + 190 * u(rng)) * 1e9;
    c.links.assign(n, std::vector<Link>(n));
    // The clipping norm's round is the slowest pair's at each boundary here, each pipeline's own
    // there: the same when there is one pipeline or one latency.
    const double latency = (0.1 + 49.9 * u(rng)) * 1e-3;
    for (auto& row : c.links) {
      for (Link& l : row) l = {D == 1 ? (0.1 + 49.9 * u(rng)) * 1e-3 : latency, std::pow(10.0, 7 + 3 * u(rng)) / 8};
    }
    Placement p(n);  // S x D distinct workers of the n, at random
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    p.resize(S * D);
    JobShape pipes = job;
    pipes.replicas = D;
    pipes.micro_batches = m;
    const Cost want = Evaluate(pipes, c, p);
    const Cost got = EvaluateCounts(job, std::vector<int>(S, D), c, p);
    SCOPED_TRACE(testing::Message() << "instance " << t << ": " << S << " stages x " << D << ", " << m
                                    << " micro-batches a replica");
    EXPECT_NEAR(got.step_s, want.step_s, 1e-9 * want.step_s);
    EXPECT_NEAR(got.dp_s, want.dp_s, 1e-9 * std::max(1.0, want.dp_s));
  }
}

// replicas [2, 1] on 4 workers; every link of worker 1 is slow. The naive order puts stage 1 (which
// both replicas of stage 0 stream to) on worker 1; the search moves it to the spare, worker 3.
TEST(PlacementCounts, TheSolverKeepsTheFanInOffASlowWorker) {
  JobShape job = Shape(2, 4, 2e9, 4e6, 4e6);
  Cluster c = Uniform(4, 100e9, {1e-3, 1.25e9});  // 10 Gbit/s
  for (int j = 0; j < 4; ++j) {
    if (j == 1) continue;
    c.links[1][j] = c.links[j][1] = {20e-3, 1.25e6};  // 10 Mbit/s
  }
  const std::vector<int> counts = {2, 1};
  const Placement naive = NaiveCountsPlacement(counts);
  ASSERT_EQ(naive, (Placement{0, 1, 2}));
  const Cost before = EvaluateCounts(job, counts, c, naive);
  const Solution s = SolveCounts(job, counts, c, {});
  EXPECT_EQ(std::count(s.placement.begin(), s.placement.end(), 1), 0) << s.method;
  EXPECT_LT(s.cost.step_s * 10, before.step_s) << s.method;
  EXPECT_GT(s.evaluated, 1);
}

}  // namespace
}  // namespace longhaul::coordinator::placement
