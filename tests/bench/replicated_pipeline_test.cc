// bench/replicated_pipeline.h, the in-process driver of `longhaul-bench convergence --replicas` and
// `sweep --data-parallel`: with per-stage replica counts and fp32 synchronisation, a step's loss is
// the single pipeline's on the same global batch (the fans route every micro-batch, the gradients
// from a stage with another count are scaled by N_s / N_s+1, and clip_norm 0.05 makes the clipping
// factor, which a wrong scale would change, act at every step).
#include "bench/replicated_pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_join.h"
#include "stage_runtime/pipeline.h"

namespace longhaul::bench {
namespace {

stage_runtime::PipelineOptions Options(int stages) {
  stage_runtime::PipelineOptions o;
  o.model = {3, 32, 2, 16, 64};  // layers, hidden, heads, context, vocabulary
  o.stages = stages;
  o.micro_batches = 4;
  o.micro_batch_size = 2;
  o.optimizer.clip_norm = 0.05;
  o.optimizer.lr = 1e-2;  // no warm-up: the steps after the first see what the first did
  o.optimizer.warmup_steps = 0;
  o.optimizer.total_steps = 100;
  return o;
}

std::vector<stage_runtime::Batch> Batches(int step, const stage_runtime::PipelineOptions& o) {
  torch::manual_seed(100 + step);
  std::vector<stage_runtime::Batch> b;
  for (int m = 0; m < o.micro_batches; ++m) {
    torch::Tensor t = torch::randint(o.model.vocab, {o.micro_batch_size, o.model.context + 1}, torch::kInt64);
    b.push_back({t.narrow(1, 0, o.model.context).contiguous(), t.narrow(1, 1, o.model.context).contiguous()});
  }
  return b;
}

constexpr int kSteps = 6;

// The largest relative difference of a step's loss or gradient norm from the single pipeline's,
// over kSteps steps.
double LargestDifference(const std::vector<int>& counts) {
  const stage_runtime::PipelineOptions o = Options(static_cast<int>(counts.size()));
  auto single = stage_runtime::InProcessPipeline::Create(o);
  EXPECT_TRUE(single.ok()) << single.status();
  auto replicated = ReplicatedPipeline::Create(o, counts, collective::DpCodec::kFp32, 2, 4);
  EXPECT_TRUE(replicated.ok()) << replicated.status();
  if (!single.ok() || !replicated.ok()) return INFINITY;
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<stage_runtime::Batch> b = Batches(step, o);
    auto a = (*single)->TrainStep(b);
    auto r = (*replicated)->TrainStep(b);
    EXPECT_TRUE(a.ok() && r.ok()) << (a.ok() ? r.status() : a.status());
    if (!a.ok() || !r.ok()) return INFINITY;
    worst = std::max(worst, std::abs(r->loss - a->loss) / std::abs(a->loss));
    // The global norm before clipping: a wrong gradient scale shows from the first step.
    worst = std::max(worst, std::abs(r->grad_norm - a->grad_norm) / std::abs(a->grad_norm));
  }
  return worst;
}

TEST(ReplicatedPipelineTest, PerStageCountsMatchOnePipeline) {
  for (const std::vector<int>& counts : std::vector<std::vector<int>>{{2, 2}, {2, 1}, {1, 2}, {1, 4, 2}}) {
    const double d = LargestDifference(counts);
    std::printf("replicas [%s]: largest relative difference %.3g\n", absl::StrJoin(counts, ", ").c_str(), d);
    EXPECT_LT(d, 1e-5) << absl::StrJoin(counts, ", ");
  }
}

TEST(ReplicatedPipelineTest, BadCountsAreRefused) {
  const stage_runtime::PipelineOptions o = Options(2);
  for (const std::vector<int>& counts : std::vector<std::vector<int>>{{2}, {1, 1}, {3, 1}, {0, 2}}) {
    auto p = ReplicatedPipeline::Create(o, counts, collective::DpCodec::kFp32, 2, 4);
    EXPECT_FALSE(p.ok()) << absl::StrJoin(counts, ", ");
    if (!p.ok()) {
      EXPECT_FALSE(p.status().message().empty());
    }
  }
}

}  // namespace
}  // namespace longhaul::bench
