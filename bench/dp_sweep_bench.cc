// longhaul-bench sweep --data-parallel (docs/replicated-stages.md): replicated stages in this
// process (bench/replicated_pipeline.h: the workers' ReplicaSync over in-process transports), the
// replicas dealt to regions, every link between regions shaped at the rate, and per (rate,
// data-parallel codec) the step time and the syncs against their bounds.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "bench/replicated_pipeline.h"
#include "bench/sweep_flags.h"
#include "common/flags.h"
#include "stage_runtime/data.h"

namespace longhaul::bench {
namespace {

// One data-parallel cell's jobs, averaged over the measured steps: the step's wall time and, per
// stage, its slowest replica's sync wall time and the most bytes one of its replicas sent to one
// replica in another region (the busiest directed link between regions).
struct DpSample {
  double step_s = 0;
  std::vector<double> sync_s;
  std::vector<double> update_s;  // of sync_s, the slowest replica's update (optimizer, norm exchange)
  std::vector<int64_t> busiest_link_bytes;
  // The replica whose sync started last (ReplicatedPipeline::StageDp): when, after the first's
  // start (the skew), its sync's wall time and its busiest link's bytes.
  std::vector<double> last_start_s, skew_s, last_sync_s;
  std::vector<int64_t> last_link_bytes;
  int64_t bytes = 0, raw_bytes = 0;  // every replica and stage, per step
};

}  // namespace

// --data-parallel: every cell is a fresh ReplicatedPipeline (same seed) trained 1 + --steps steps;
// the first (warm-up) is not timed. Bounds, per stage s (the sync follows the stage's backward
// pass, and the step ends when every stage's sync has): the replica of stage s whose backward pass
// ends last starts its sync when it does unshaped (the data-parallel links do not carry the
// pipeline's traffic), and no byte it sends can leave before; its sync then takes at least the
// larger of its unshaped sync and its bytes to its busiest peer in another region, at the rate
// (each directed pair of regions' replicas has the rate to itself, as longhaul-netem's
// between_regions, so messages to different peers may overlap). The step bound is the largest
// stage's sum; the sync columns are that replica's. fraction = bound / measured (1 = at the bound).
// (Until this bound, the first replica's start and the slowest sync: that assumed the link time
// could pass while the first replica waited for the last, before the last had anything to send.)
int RunDpSweep(const SweepFlags& f, const CLI::App& cmd) {
  const std::vector<double> rates = cmd.count("--rates") ? f.rates : std::vector<double>{10, 100};
  const int stages = static_cast<int>(f.stages > 0 ? f.stages : 2);
  const int64_t mbs = cmd.count("--micro-batches") ? f.micro_batches : 8;
  const int64_t mbsize = cmd.count("--micro-batch-size") ? f.micro_batch_size : 4;
  const int R = static_cast<int>(f.dp_replicas), Y = static_cast<int>(f.dp_regions);
  if (R < 2 || Y < 1 || Y > R) return common::FlagError(cmd, "--dp-replicas must be >= 2 and --dp-regions in [1, replicas]");
  if (mbs % R != 0) return common::FlagError(cmd, "--micro-batches must be a multiple of --dp-replicas");
  for (double r : rates) {
    if (!(r > 0)) return common::FlagError(cmd, absl::StrCat("bad rate \"", r, "\" (rates are Mbit/s > 0)"));
  }
  stage_runtime::PipelineOptions o;
  o.model = {static_cast<int>(f.layers), static_cast<int>(f.hidden), 4, static_cast<int>(f.context), 256};
  o.stages = stages;
  o.micro_batches = static_cast<int>(mbs);
  o.micro_batch_size = static_cast<int>(mbsize);
  o.schedule = f.schedule == "gpipe" ? stage_runtime::Schedule::kGPipe : stage_runtime::Schedule::k1F1B;
  o.optimizer.total_steps = static_cast<int>(f.steps + 1);
  auto data = stage_runtime::OpenDataset({"text", stage_runtime::kDefaultCorpusDir, 256, 0.1}, o.model.context);
  if (!data.ok()) return common::FlagError(cmd, std::string(data.status().message()));
  torch::set_num_threads(1);  // one compute thread per replica and stage already fill this machine
  auto cell = [&](const std::string& codec, double rate) -> absl::StatusOr<DpSample> {
    absl::StatusOr<collective::DpCodec> c = collective::ParseDpCodec(codec);
    if (!c.ok()) return c.status();
    netem::LinkProfile between;
    between.rate_bytes_per_s = rate * 1e6 / 8;
    auto p = ReplicatedPipeline::Create(o, R, *c, Y, 4, between);
    if (!p.ok()) return p.status();
    std::vector<DpSample> steps;
    for (int64_t step = 0; step <= f.steps; ++step) {
      std::vector<stage_runtime::Batch> b;
      for (int m = 0; m < o.micro_batches; ++m) {
        b.push_back((*data)->Sample(stage_runtime::Split::kTrain, o.seed, step, m, o.micro_batch_size, o.model.context));
      }
      const absl::Time t0 = absl::Now();
      auto r = (*p)->TrainStep(b);
      if (!r.ok()) return r.status();
      if (step == 0) continue;  // warm-up
      DpSample x;
      x.step_s = absl::ToDoubleSeconds(absl::Now() - t0);
      for (const auto& st : (*p)->last_stage_dp()) {
        x.sync_s.push_back(absl::ToDoubleSeconds(st.wall));
        x.update_s.push_back(absl::ToDoubleSeconds(st.update));
        x.busiest_link_bytes.push_back(st.busiest_link);
        x.last_start_s.push_back(absl::ToDoubleSeconds(st.last_start));
        x.skew_s.push_back(absl::ToDoubleSeconds(st.last_start - st.first_start));
        x.last_sync_s.push_back(absl::ToDoubleSeconds(st.last_wall));
        x.last_link_bytes.push_back(st.last_busiest_link);
      }
      x.bytes = (*p)->last_dp().bytes_sent, x.raw_bytes = (*p)->last_dp().bytes_sent_uncompressed;
      steps.push_back(std::move(x));
    }
    DpSample mean;
    for (auto* v : {&mean.sync_s, &mean.update_s, &mean.last_start_s, &mean.skew_s, &mean.last_sync_s}) {
      v->assign(static_cast<size_t>(stages), 0.0);
    }
    mean.busiest_link_bytes.assign(static_cast<size_t>(stages), 0);
    mean.last_link_bytes.assign(static_cast<size_t>(stages), 0);
    for (const DpSample& x : steps) {
      const double w = 1.0 / static_cast<double>(steps.size());
      mean.step_s += x.step_s * w;
      for (int s = 0; s < stages; ++s) {
        mean.sync_s[s] += x.sync_s[s] * w;
        mean.update_s[s] += x.update_s[s] * w;
        mean.last_start_s[s] += x.last_start_s[s] * w;
        mean.skew_s[s] += x.skew_s[s] * w;
        mean.last_sync_s[s] += x.last_sync_s[s] * w;
        mean.busiest_link_bytes[s] = std::max(mean.busiest_link_bytes[s], x.busiest_link_bytes[s]);
        mean.last_link_bytes[s] = std::max(mean.last_link_bytes[s], x.last_link_bytes[s]);
      }
      mean.bytes = x.bytes, mean.raw_bytes = x.raw_bytes;
    }
    return mean;
  };
  std::vector<double> all_rates = {0};
  all_rates.insert(all_rates.end(), rates.begin(), rates.end());
  std::map<std::pair<double, std::string>, std::vector<DpSample>> samples;
  for (int64_t rep = 0; rep < f.repeats; ++rep) {
    for (double rate : all_rates) {
      for (const std::string& c : f.dp_codecs) {
        absl::StatusOr<DpSample> x = cell(c, rate);
        if (!x.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s at %g Mbit/s: %s\n", c.c_str(), rate,
                       std::string(x.status().message()).c_str());
          return 1;
        }
        if (!f.json) {
          std::string per_stage;
          for (int s = 0; s < stages; ++s) {
            // (fp32 syncs through Group::AllReduceFp32 and the executor's optimizer: no update time)
            const std::string update =
                x->update_s[s] > 0 ? absl::StrFormat("%.3f s in the update; ", x->update_s[s]) : std::string();
            absl::StrAppendFormat(&per_stage,
                                  "%s stage %d %.3f s (%s%lld bytes on its busiest link between regions; its last "
                                  "replica started %.3f s after its first, its sync %.3f s)",
                                  s ? "," : "", s, x->sync_s[s], update, static_cast<long long>(x->busiest_link_bytes[s]),
                                  x->skew_s[s], x->last_sync_s[s]);
          }
          std::fprintf(stderr, "round %lld: %s, %s: step %.3f s, sync:%s\n", static_cast<long long>(rep + 1),
                       rate > 0 ? absl::StrCat(rate, " Mbit/s").c_str() : "unshaped", c.c_str(), x->step_s,
                       per_stage.c_str());
        }
        samples[{rate, c}].push_back(*x);
      }
    }
  }
  // The median over the rounds of what `field` takes from a sample.
  auto median = [&](double rate, const std::string& c, const std::function<double(const DpSample&)>& field) {
    std::vector<double> v;
    for (const DpSample& x : samples.at({rate, c})) v.push_back(field(x));
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  auto step_of = [](const DpSample& x) { return x.step_s; };
  auto of = [](std::vector<double> DpSample::*field, int s) {
    return [field, s](const DpSample& x) { return (x.*field)[s]; };
  };
  std::string md = absl::StrFormat(
      "| between regions Mbit/s | data-parallel codec | step s | step bound s | step fraction of bound | "
      "bounding stage | its replicas' skew s (unshaped) | its last replica's sync s | that sync's bound s | "
      "that sync's fraction of bound | slowest sync s (any stage) | "
      "KB on the busiest link between regions, per step | data-parallel KB per step, all replicas / as fp32 | "
      "sync speed-up vs fp32 | step speed-up vs fp32 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  // The slowest replica's sync of any stage.
  auto slowest_sync = [](const DpSample& x) { return *std::max_element(x.sync_s.begin(), x.sync_s.end()); };
  for (double rate : rates) {
    for (const std::string& c : f.dp_codecs) {
      const DpSample& any = samples.at({rate, c}).front();
      const double step = median(rate, c, step_of), slowest = median(rate, c, slowest_sync);
      int bounding = 0;
      double step_bound = 0, sync_bound = 0;
      for (int s = 0; s < stages; ++s) {
        const double link_s = static_cast<double>(any.last_link_bytes[s]) / (rate * 1e6 / 8);
        const double sync_s = std::max(median(0, c, of(&DpSample::last_sync_s, s)), link_s);
        const double bound = median(0, c, of(&DpSample::last_start_s, s)) + sync_s;
        if (bound > step_bound) bounding = s, step_bound = bound, sync_bound = sync_s;
      }
      const double sync = median(rate, c, of(&DpSample::last_sync_s, bounding));
      const double skew = median(0, c, of(&DpSample::skew_s, bounding));
      const int64_t busiest = *std::max_element(any.busiest_link_bytes.begin(), any.busiest_link_bytes.end());
      const bool has_fp32 = samples.count({rate, "fp32"}) > 0;
      const double fp32_step = has_fp32 ? median(rate, "fp32", step_of) : 0;
      const double fp32_slowest = has_fp32 ? median(rate, "fp32", slowest_sync) : 0;
      absl::StrAppendFormat(
          &md, "| %g | %s | %.3f | %.3f | %.2f | %d | %.3f | %.3f | %.3f | %.2f | %.3f | %.1f | %.0f / %.0f | %s | %s |\n",
          rate, c, step, step_bound, step_bound / step, bounding, skew, sync, sync_bound, sync_bound / sync, slowest,
          busiest / 1e3, any.bytes / 1e3, any.raw_bytes / 1e3,
          has_fp32 ? absl::StrFormat("%.2fx", fp32_slowest / slowest) : "-",
          has_fp32 ? absl::StrFormat("%.2fx", fp32_step / step) : "-");
      rows.push_back({{"rate_mbit", rate}, {"dp_codec", c}, {"step_s", Round(step, 4)},
                      {"step_bound_s", Round(step_bound, 4)}, {"step_fraction", Round(step_bound / step, 3)},
                      {"bounding_stage", bounding}, {"bounding_stage_skew_s", Round(skew, 4)},
                      {"bounding_stage_last_sync_s", Round(sync, 4)},
                      {"bounding_stage_last_sync_bound_s", Round(sync_bound, 4)},
                      {"bounding_stage_last_sync_fraction", Round(sync_bound / sync, 3)},
                      {"slowest_sync_s", Round(slowest, 4)},
                      {"busiest_link_bytes", busiest}, {"stage_busiest_link_bytes", any.busiest_link_bytes},
                      {"dp_bytes_per_step", any.bytes}, {"dp_raw_bytes_per_step", any.raw_bytes},
                      {"slowest_sync_speedup_vs_fp32", Round(has_fp32 ? fp32_slowest / slowest : 0.0, 3)},
                      {"step_speedup_vs_fp32", Round(has_fp32 ? fp32_step / step : 0.0, 3)}});
    }
  }
  if (f.json) {
    std::printf("%s\n", nlohmann::ordered_json{{"runs", rows}}.dump(2).c_str());
  } else {
    std::printf("%s", md.c_str());
  }
  if (!f.markdown.empty()) std::ofstream(f.markdown) << md;
  return 0;
}

// The backward codec of a cell: raw forward links (the uncompressed reference) keep raw backward
// links; compressed ones get --backward, or int4 under auto.
}  // namespace longhaul::bench
