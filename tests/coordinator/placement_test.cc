// The placement's cost model and solvers (coordinator/placement.h) and the job spec's view for
// them (coordinator/job_cost.h): the formula on hand-computed cases, the exact solver against brute
// force on random instances, the heuristic against the naive order and the exact optimum, a
// two-region topology whose plan avoids the slow link, and a 64-worker instance solved in time;
// for replica counts that differ between stages (placement_counts.h), the recurrence on a
// hand-computed fan-in, agreement with the pipeline model when the counts are equal, and a solver
// that keeps the stage every replica streams to off a slow worker.
#include "coordinator/placement.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "coordinator/job_cost.h"
#include "coordinator/job_spec.h"
#include "coordinator/placement_counts.h"
#include "proto/link_spec.h"

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

// Random heterogeneous workers and asymmetric links: bandwidth log-uniform over 10 Mbit/s..10
// Gbit/s, latency 0.1..50 ms, compute 10..200 GFLOP/s.
struct Instance {
  JobShape job;
  Cluster cluster;
};
Instance Random(std::mt19937_64& rng, int n, int stages, int replicas = 1) {
  std::uniform_real_distribution<double> u(0, 1);
  Instance in;
  in.job = Shape(stages, 1 + static_cast<int>(rng() % 8), 0, 0, 0);
  in.job.replicas = replicas;
  in.job.schedule = rng() % 2 == 0 ? Schedule::k1F1B : Schedule::kGPipe;
  for (double& f : in.job.stage_flops) f = (0.5 + u(rng)) * 2e9;
  in.job.activation_bytes = (0.2 + u(rng)) * 4e6;
  in.job.gradient_bytes = in.job.activation_bytes * (0.3 + u(rng));
  for (double& g : in.job.stage_grad_bytes) g = (0.5 + u(rng)) * 4e7;
  in.cluster.flops_per_s.resize(n);
  for (double& f : in.cluster.flops_per_s) f = (10 + 190 * u(rng)) * 1e9;
  in.cluster.links.assign(n, std::vector<Link>(n));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      in.cluster.links[i][j] = {(0.1 + 49.9 * u(rng)) * 1e-3, std::pow(10.0, 7 + 3 * u(rng)) / 8};
    }
  }
  return in;
}

// Every ordered choice of job.workers() of the cluster's workers, no pruning, no symmetry.
Cost BruteForce(const JobShape& job, const Cluster& c) {
  Cost best;
  best.step_s = std::numeric_limits<double>::infinity();
  Placement p;
  std::vector<char> used(c.size(), 0);
  std::function<void()> rec = [&] {
    if (static_cast<int>(p.size()) == job.workers()) {
      const Cost x = Evaluate(job, c, p);
      if (x.step_s < best.step_s) best = x;
      return;
    }
    for (int w = 0; w < c.size(); ++w) {
      if (used[w]) continue;
      used[w] = 1;
      p.push_back(w);
      rec();
      p.pop_back();
      used[w] = 0;
    }
  };
  rec();
  return best;
}

bool Valid(const Placement& p, int k, int n) {
  std::vector<char> seen(n, 0);
  for (int w : p) {
    if (w < 0 || w >= n || seen[w]) return false;
    seen[w] = 1;
  }
  return static_cast<int>(p.size()) == k;
}

TEST(CostModelTest, ComputeBoundPipelineIsMPlusSMinusOneStages) {
  // 4 stages of 1 GFLOP on 10 GFLOP/s workers (0.1 s), free links: (M + S - 1) x 0.1 s, the bubble
  // of both schedules.
  for (Schedule sched : {Schedule::k1F1B, Schedule::kGPipe}) {
    JobShape job = Shape(4, 8, 1e9, 0, 0);
    job.schedule = sched;
    const Cluster c = Uniform(4, 1e10, {0, 1e12});
    const Cost x = Evaluate(job, c, NaivePlacement(job));
    EXPECT_NEAR(x.step_s, (8 + 4 - 1) * 0.1, 1e-9) << ScheduleName(sched);
    EXPECT_NEAR(x.period_s, 0.1, 1e-9) << ScheduleName(sched);
    EXPECT_EQ(x.limit, Cost::Limit::kCompute);
  }
}

TEST(CostModelTest, GPipeIsAForwardAndABackwardFlowLine) {
  // 3 stages, compute 10 ms each (3.3 ms forward, 6.7 ms backward); links 1 ms one way; 1 MB of
  // activations, 0.5 MB of gradients; link 0->1 at 100 MB/s (10 ms forward, 5 ms back), link
  // 1->2 at 10 MB/s (100 ms forward, 50 ms back).
  JobShape job = Shape(3, 4, 1e8, 1e6, 5e5);
  job.schedule = Schedule::kGPipe;
  Cluster c = Uniform(3, 1e10, {1e-3, 1e8});
  c.links[1][2] = {1e-3, 1e7};
  c.links[2][1] = {1e-3, 1e7};
  const Cost x = Evaluate(job, c, NaivePlacement(job));
  // Forward phase paced by the slow link's 100 ms, backward by its 50 ms: a bottleneck per
  // phase, not a sum over the links, and not one period for both directions at once.
  EXPECT_NEAR(x.period_s, 0.1 + 0.05, 1e-12);
  EXPECT_EQ(x.limit, Cost::Limit::kLinkForward);
  EXPECT_EQ(x.limit_stage, 1);
  // Fill and drain: 3 x 10 ms compute + link 0-1 (1 + 10 + 1 + 5 ms) + link 1-2 (1 + 100 + 1 +
  // 50 ms); norm exchange: 4 x 1 ms.
  const double fill = 0.030 + 0.017 + 0.152 + 0.004;
  EXPECT_NEAR(x.fill_drain_s, fill, 1e-12);
  EXPECT_NEAR(x.step_s, 3 * 0.15 + fill, 1e-12);
}

TEST(CostModelTest, OneFOneBOverlapsALinksDirectionsOnlyAfterItsWarmUp) {
  // 4 stages, no compute, one slow link (X = 0.5 s each way) at position k, the others free:
  // stage k + 1 sends its first gradient after its warm-up's min(S - k - 2, M) + 1 activations
  // have arrived, so the slow link carries min(S - k - 1, M) activations alone before both
  // directions overlap: (M + min(S - k - 1, M)) X. GPipe never overlaps them: 2 M X.
  const double X = 0.5;
  for (int M : {1, 2, 4, 8}) {
    for (int k = 0; k < 3; ++k) {
      JobShape job = Shape(4, M, 0, 1e6, 1e6);
      Cluster c = Uniform(4, 1e10, {0, 1e15});
      c.links[k][k + 1] = c.links[k + 1][k] = {0, 1e6 / X};
      const Cost x = Evaluate(job, c, NaivePlacement(job));
      EXPECT_NEAR(x.step_s, (M + std::min(4 - k - 1, M)) * X, 1e-7) << "M " << M << ", slow link " << k;
      EXPECT_NEAR(x.period_s, X, 1e-12);
      EXPECT_NEAR(x.step_s, (M - 1) * x.period_s + x.fill_drain_s, 1e-7);
      job.schedule = Schedule::kGPipe;
      EXPECT_NEAR(Evaluate(job, c, NaivePlacement(job)).step_s, 2 * M * X, 1e-7);
    }
  }
}

// The model's step recomputed from scratch: every operation's end as the longest path to it,
// found by relaxing all of them until nothing changes (a different algorithm from placement.cc's
// sweeps and closed form), with each stage's operations in stage_runtime/schedule.cc's order.
double ReferenceStep(const JobShape& job, const Cluster& c, const Placement& p) {
  const int S = job.stages, M = job.micro_batches;
  std::vector<std::vector<std::pair<bool, int>>> ops(S);  // (forward, micro-batch)
  for (int s = 0; s < S; ++s) {
    const int w = job.schedule == Schedule::kGPipe ? M : std::min(S - s - 1, M);
    for (int j = 0; j < w; ++j) ops[s].push_back({true, j});
    for (int j = 0; j < M - w; ++j) {
      ops[s].push_back({true, w + j});
      ops[s].push_back({false, j});
    }
    for (int j = M - w; j < M; ++j) ops[s].push_back({false, j});
  }
  auto cs = [&](int s) { return job.stage_flops[s] / c.flops_per_s[p[s]]; };
  const Link no_link;
  auto fwd = [&](int s) -> const Link& { return s + 1 < S ? c.links[p[s]][p[s + 1]] : no_link; };
  auto bwd = [&](int s) -> const Link& { return s + 1 < S ? c.links[p[s + 1]][p[s]] : no_link; };
  std::vector<std::vector<double>> end(S, std::vector<double>(2 * M, 0)), fend(S, std::vector<double>(M, 0)),
      bend(S, std::vector<double>(M, 0)), fsent(S, std::vector<double>(M, 0)), bsent(S, std::vector<double>(M, 0));
  for (bool changed = true; changed;) {
    changed = false;
    auto raise = [&](double& x, double v) {
      if (v > x + 1e-15) x = v, changed = true;
    };
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < 2 * M; ++k) {
        const auto [forward, j] = ops[s][k];
        double ready = k > 0 ? end[s][k - 1] : 0;
        if (forward && s > 0) ready = std::max(ready, fsent[s - 1][j] + fwd(s - 1).latency_s);
        if (!forward && s + 1 < S) ready = std::max(ready, bsent[s][j] + bwd(s).latency_s);
        const double e = ready + (forward ? job.forward_share : 1 - job.forward_share) * cs(s);
        raise(end[s][k], e);
        raise(forward ? fend[s][j] : bend[s][j], e);
      }
      for (int j = 0; s + 1 < S && j < M; ++j) {  // link s's messages, in micro-batch order
        raise(fsent[s][j], std::max(fend[s][j], j > 0 ? fsent[s][j - 1] : 0.0) + job.activation_bytes / fwd(s).bytes_per_s);
        raise(bsent[s][j], std::max(bend[s + 1][j], j > 0 ? bsent[s][j - 1] : 0.0) + job.gradient_bytes / bwd(s).bytes_per_s);
      }
    }
  }
  double t = 0;
  for (int s = 0; s < S; ++s) t = std::max(t, end[s].back());
  for (int s = 0; s + 1 < S; ++s) t += fwd(s).latency_s + bwd(s).latency_s;  // the norm exchange
  return t;
}

TEST(CostModelTest, BothSchedulesMatchTheirStepsRecurrenceOnRandomPipelines) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 200; ++t) {
    const int stages = 1 + static_cast<int>(rng() % 6);
    Instance in = Random(rng, stages, stages);
    const Placement p = NaivePlacement(in.job);
    const Cost x = Evaluate(in.job, in.cluster, p);
    EXPECT_NEAR(x.step_s, ReferenceStep(in.job, in.cluster, p), 1e-9 * x.step_s)
        << "instance " << t << ": " << ScheduleName(in.job.schedule) << ", " << stages << " stages, "
        << in.job.micro_batches << " micro-batches";
    EXPECT_NEAR(x.step_s, (in.job.micro_batches - 1) * x.period_s + x.fill_drain_s, 1e-9 * x.step_s);
    EXPECT_GE(x.fill_drain_s, 0);
  }
}

TEST(CostModelTest, DataParallelSyncFollowsDtFm) {
  // 2 replicas x 1 stage: each member sends 2 (alpha + 8 c / (D beta)) to the other.
  JobShape job = Shape(1, 1, 0, 0, 0);
  job.replicas = 2;
  job.stage_grad_bytes = {8e6};
  const Cluster c = Uniform(2, 1e10, {0.01, 1e8});
  const Cost x = Evaluate(job, c, NaivePlacement(job));
  EXPECT_NEAR(x.dp_s, 2 * (0.01 + 8e6 / 2 / 1e8), 1e-12);
  EXPECT_NEAR(x.step_s, x.dp_s, 1e-12);
}

TEST(CostModelTest, AnUnusableLinkCostsForever) {
  const JobShape job = Shape(2, 2, 1e8, 1e6, 1e6);
  Cluster c = Uniform(3, 1e10, {1e-3, 1e8});
  c.links[0][1].bytes_per_s = 0;
  EXPECT_TRUE(std::isinf(Evaluate(job, c, {0, 1}).step_s));
  const Solution s = Solve(job, c);
  EXPECT_TRUE(std::isfinite(s.cost.step_s));
  EXPECT_NE(s.placement, (Placement{0, 1}));
}

TEST(SolverTest, ExactMatchesBruteForceOnRandomInstances) {
  std::mt19937_64 rng(42);
  for (int t = 0; t < 60; ++t) {
    const int n = 2 + static_cast<int>(rng() % 7);  // 2..8 workers
    const int replicas = n >= 4 && rng() % 4 == 0 ? 2 : 1;
    const int stages = std::max(1, static_cast<int>(1 + rng() % std::min(n / replicas, 6)));
    const Instance in = Random(rng, n, stages, replicas);
    const Solution s = SolveExact(in.job, in.cluster);
    ASSERT_TRUE(Valid(s.placement, in.job.workers(), n));
    const Cost brute = BruteForce(in.job, in.cluster);
    EXPECT_NEAR(s.cost.step_s, brute.step_s, 1e-9 * brute.step_s)
        << "instance " << t << ": " << n << " workers, " << stages << " stages x " << replicas;
    EXPECT_NEAR(Evaluate(in.job, in.cluster, s.placement).step_s, s.cost.step_s, 1e-12 * s.cost.step_s);
  }
}

TEST(SolverTest, HeuristicIsNeverWorseThanNaiveAndCloseToTheOptimum) {
  std::mt19937_64 rng(7);
  double worst_ratio = 1;
  for (int t = 0; t < 40; ++t) {
    const int n = 3 + static_cast<int>(rng() % 6);  // 3..8 workers
    const int stages = 2 + static_cast<int>(rng() % (n - 1));
    const Instance in = Random(rng, n, stages);
    SolveOptions o;
    o.seed = static_cast<uint64_t>(t);
    const Solution h = SolveHeuristic(in.job, in.cluster, o);
    ASSERT_TRUE(Valid(h.placement, in.job.workers(), n));
    const double naive = Evaluate(in.job, in.cluster, NaivePlacement(in.job)).step_s;
    EXPECT_LE(h.cost.step_s, naive * (1 + 1e-12));
    const double exact = SolveExact(in.job, in.cluster).cost.step_s;
    worst_ratio = std::max(worst_ratio, h.cost.step_s / exact);
    EXPECT_LE(h.cost.step_s, exact * 1.05) << "instance " << t;
  }
  RecordProperty("worst_heuristic_over_exact", std::to_string(worst_ratio));
}

TEST(SolverTest, HeuristicBeatsNaiveOnLargerInstances) {
  std::mt19937_64 rng(3);
  for (int t = 0; t < 5; ++t) {
    const Instance in = Random(rng, 24, 8, t % 2 ? 2 : 1);
    SolveOptions o;
    o.rounds = 50;
    const Solution h = Solve(in.job, in.cluster, o);
    EXPECT_FALSE(h.exact);
    ASSERT_TRUE(Valid(h.placement, in.job.workers(), 24));
    EXPECT_LT(h.cost.step_s, Evaluate(in.job, in.cluster, NaivePlacement(in.job)).step_s);
  }
}

// Two regions, fast inside (10 Gbit/s, 0.5 ms) and 100x slower between (100 Mbit/s, 40 ms), the
// workers' ids alternating between them: the naive order crosses the slow link at every stage.
Cluster TwoRegions(int n, std::vector<int>* region) {
  Cluster c = Uniform(n, 5e10, {0.5e-3, 10e9 / 8});
  region->resize(n);
  for (int i = 0; i < n; ++i) (*region)[i] = i % 2;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if ((*region)[i] != (*region)[j]) c.links[i][j] = {40e-3, 100e6 / 8};
    }
  }
  return c;
}

int Crossings(const Placement& p, const std::vector<int>& region) {
  int n = 0;
  for (size_t s = 0; s + 1 < p.size(); ++s) n += region[p[s]] != region[p[s + 1]];
  return n;
}

TEST(SolverTest, TwoRegionPlanCrossesTheSlowLinkOnlyWhenItMust) {
  std::vector<int> region;
  const Cluster c = TwoRegions(8, &region);
  // GPT-2-small-like traffic: 8 x 1024 tokens x 768 hidden, int8 on the wire (~6.4 MB).
  // 50 ms of compute per stage and micro-batch.
  const JobShape full = Shape(8, 8, 2.5e9, 6.4e6, 6.4e6);
  const Solution s8 = Solve(full, c);
  EXPECT_TRUE(s8.exact);
  EXPECT_EQ(Crossings(s8.placement, region), 1);
  const double naive8 = Evaluate(full, c, NaivePlacement(full)).step_s;
  EXPECT_EQ(Crossings(NaivePlacement(full), region), 7);
  EXPECT_GE(naive8 / s8.cost.step_s, 2.0) << s8.cost.step_s << " vs naive " << naive8;
  // Four stages fit in one region: no crossing at all.
  const JobShape half = Shape(4, 8, 2.5e9, 6.4e6, 6.4e6);
  const Solution s4 = Solve(half, c);
  EXPECT_EQ(Crossings(s4.placement, region), 0);
  // The heuristic finds the same on a larger two-region cluster.
  const Cluster c32 = TwoRegions(32, &region);
  SolveOptions o;
  o.exact_limit = 0;
  const Solution h = Solve(Shape(16, 8, 2.5e9, 6.4e6, 6.4e6), c32, o);
  EXPECT_FALSE(h.exact);
  EXPECT_EQ(Crossings(h.placement, region), 0);
}

// 64 workers in 8 "cities" (8 each): inside a city 10 Gbit/s and 0.1 ms; between cities 0.5..2
// Gbit/s and 5..150 ms, like DT-FM's geo-distributed setting; 8 stages x 8 replicas.
TEST(SolverTest, SixtyFourWorkersInEightCitiesSolveInTime) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  const int n = 64;
  Cluster c = Uniform(n, 1e14, {0.1e-3, 10e9 / 8});
  std::vector<std::vector<Link>> city(8, std::vector<Link>(8));
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) city[a][b] = city[b][a] = {(5 + 145 * u(rng)) * 1e-3, (0.5 + 1.5 * u(rng)) * 1e9 / 8};
  }
  std::vector<int> where(n);
  for (int i = 0; i < n; ++i) where[i] = static_cast<int>(rng() % 8);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (where[i] != where[j]) c.links[i][j] = city[where[i]][where[j]];
    }
  }
  JobShape job = Shape(8, 32, 6e13, 2.5e7, 2.5e7);
  job.replicas = 8;
  job.stage_grad_bytes.assign(8, 4 * 1.3e9 / 8);
  SolveOptions o;
  o.time_limit = absl::Seconds(8);
  const absl::Time t0 = absl::Now();
  const Solution s = Solve(job, c, o);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  EXPECT_LT(seconds, 10);
  ASSERT_TRUE(Valid(s.placement, 64, n));
  std::vector<int> random(n);
  std::iota(random.begin(), random.end(), 0);
  std::shuffle(random.begin(), random.end(), rng);
  const double r = Evaluate(job, c, random).step_s;
  const double naive = Evaluate(job, c, NaivePlacement(job)).step_s;
  EXPECT_LT(s.cost.step_s, r);
  EXPECT_LE(s.cost.step_s, naive);
  RecordProperty("solve_seconds", std::to_string(seconds));
  RecordProperty("speedup_over_random", std::to_string(r / s.cost.step_s));
}

// ---------------------------------------------------------------------------------------------
// The job spec's view.

TEST(JobCostTest, FlopsAndWireBytesFollowTheSpec) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(R"(
model: {layers: 4, hidden: 64, heads: 4, context: 32, vocab: 256}
stages: 2
micro_batches: 3
micro_batch_size: 2
codecs: {forward: fp32, backward: int8}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobShape> job = JobShapeOf(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->stages, 2);
  EXPECT_EQ(job->micro_batches, 3);
  EXPECT_EQ(job->schedule, Schedule::k1F1B);  // the spec's default
  EXPECT_DOUBLE_EQ(job->forward_share, 1.0 / 3);
  const double n = 2 * 32, h = 64;
  const double block = 24 * n * h * h + 4 * n * 32 * h;
  EXPECT_DOUBLE_EQ(job->stage_flops[0], 3 * 2 * block);
  EXPECT_DOUBLE_EQ(job->stage_flops[1], 3 * (2 * block + 2 * n * h * 256));
  const double header = 40 + 24;
  EXPECT_DOUBLE_EQ(job->activation_bytes, header + 4 * n * h);
  // int8, groups of 64: per token 2 bytes + 3 per group + 64 codes.
  EXPECT_DOUBLE_EQ(job->gradient_bytes, header + n * (2 + 3 + 64));
  // tahquant at its defaults (4/3 bits, 80% at 4) is smaller still.
  absl::StatusOr<double> tah = WireBytes("tahquant", 64, 64);
  ASSERT_TRUE(tah.ok());
  EXPECT_LT(*tah, job->gradient_bytes);
  EXPECT_FALSE(WireBytes("nope", 1, 1).ok());
  absl::StatusOr<v1::JobSpec> gpipe = ParseJobSpec("stages: 2\nschedule: gpipe\n");
  ASSERT_TRUE(gpipe.ok()) << gpipe.status();
  EXPECT_EQ(JobShapeOf(*gpipe)->schedule, Schedule::kGPipe);
}

TEST(JobCostTest, EmulatedRateAndDelayApplyOnTopOfTheMeasurement) {
  v1::LinkSpec none;
  Link l = EffectiveLink(/*rtt_ms=*/2, /*mbit=*/800, none);
  EXPECT_DOUBLE_EQ(l.latency_s, 1e-3);
  EXPECT_DOUBLE_EQ(l.bytes_per_s, 100e6);
  v1::LinkSpec shaped;
  shaped.set_rate_mbit(80);
  shaped.set_delay_ms(20);
  l = EffectiveLink(2, 800, shaped);
  EXPECT_DOUBLE_EQ(l.latency_s, 21e-3);
  EXPECT_DOUBLE_EQ(l.bytes_per_s, 10e6);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 40, shaped).bytes_per_s, 5e6);  // slower than the emulated rate
  v1::LinkSpec paced;  // the senders' pace on a real link caps it too; a slower measurement wins
  paced.set_pace_mbit(160);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, paced).bytes_per_s, 20e6);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 40, paced).bytes_per_s, 5e6);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, paced).latency_s, 1e-3);
}

// links.between_regions_mbit caps the links between workers of different regions instead of
// rate_mbit; links within a region keep rate_mbit (unshaped when it is 0).
TEST(JobCostTest, LinksBetweenRegionsTakeTheirOwnRate) {
  v1::LinkSpec spec;
  spec.set_between_regions_mbit(8);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, spec, "eu", "us").bytes_per_s, 1e6);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, spec, "eu", "eu").bytes_per_s, 100e6);
  spec.set_rate_mbit(80);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, spec, "eu", "us").bytes_per_s, 1e6);
  EXPECT_DOUBLE_EQ(EffectiveLink(2, 800, spec, "us", "us").bytes_per_s, 10e6);
  const v1::LinkSpec across = LinkSpecBetween(spec, "eu", "us"), within = LinkSpecBetween(spec, "eu", "eu");
  EXPECT_DOUBLE_EQ(across.rate_mbit(), 8);
  EXPECT_DOUBLE_EQ(within.rate_mbit(), 80);
  EXPECT_DOUBLE_EQ(across.between_regions_mbit(), 0);  // resolved: a sender shapes by rate_mbit only
}

// Replica counts that differ between stages (coordinator/placement_counts.h).

// replicas [2, 1], 4 micro-batches, 1F1B, every operation's compute 1/3 (forward) or 2/3
// (backward), links free. Stage 1's one worker runs all four micro-batches in order (F0 B0 F1 B1
// ...: done at 13/3); replica 1 of stage 0 (micro-batches 2 and 3) waits for its gradients until
// then: B of micro-batch 3 starts at 13/3 and ends at 5.
TEST(PlacementCounts, FanInOnHandComputedTimes) {
  const JobShape job = Shape(2, 4, 1, 0, 0);
  const Cluster c = Uniform(3, 1, {0, 1e9});
  const Cost x = EvaluateCounts(job, {2, 1}, c, NaiveCountsPlacement({2, 1}));
  EXPECT_NEAR(x.step_s, 5.0, 1e-12);
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
}

}  // namespace
}  // namespace longhaul::coordinator::placement
