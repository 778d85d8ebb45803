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
#include "absl/strings/str_join.h"
#include "bench/benchmarks.h"
#include "bench/link_bounds.h"
#include "bench/replicated_pipeline.h"
#include "bench/sweep_flags.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "stage_runtime/compute_threads.h"
#include "stage_runtime/data.h"

namespace longhaul::bench {
namespace {

// A sync's bucketed parts, in ms after its start: "[0: p0 0.1-0.9 t0 0.9-2.0 ...] [1: ...] ms", one
// bracket per bucketed collective (collective::BucketSpan::pipeline: sdp4bit / zeropp 0 the
// reduce-scatter, 1 the weights' all-gather; BitDP 0 its planes), p / t / c: a bucket's produce,
// transfer and consume (RunBucketPipeline).
std::string BucketSpansText(const std::vector<collective::BucketSpan>& spans) {
  std::string out;
  for (size_t i = 0; i < spans.size(); ++i) {
    const collective::BucketSpan& b = spans[i];
    if (i == 0 || b.pipeline != spans[i - 1].pipeline) absl::StrAppend(&out, i ? "] [" : "[", b.pipeline, ":");
    absl::StrAppendFormat(&out, " %c%d %.1f-%.1f", b.part, b.bucket, absl::ToDoubleMilliseconds(b.start),
                          absl::ToDoubleMilliseconds(b.end));
  }
  return spans.empty() ? out : out + "] ms";
}

// The largest minus the smallest of `v` (0 for none).
double Spread(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

// One data-parallel cell's jobs, averaged over the measured steps: the step's wall time and, per
// stage, its slowest replica's sync wall time and the most bytes one of its replicas sent to one
// replica in another region (the busiest directed link between regions).
struct DpSample {
  double step_s = 0;
  std::vector<double> sync_s;
  std::vector<double> update_s;  // of sync_s, the slowest replica's update (optimizer, norm exchange)
  std::vector<std::vector<double>> phase_starts_s;  // the slowest replica's sync's phases' starts
  // The slowest replica's bucketed parts in the last measured step (BucketSpansText), per stage,
  // and how far apart that step's replicas of the stage started their syncs (a mean over the steps
  // hides one step's skew, which the first bucket waits for).
  std::vector<std::string> bucket_spans;
  std::vector<double> last_start_spread_s;
  std::vector<int64_t> busiest_link_bytes;
  // Per stage and replica (ReplicatedPipeline::ReplicaDp): its sync's start after the step's, its
  // sync's wall time, its busiest link's bytes; the time before its update began (-1: no update)
  // and after it ended, and its busiest link's bytes before and after the update.
  std::vector<std::vector<double>> start_s, replica_sync_s, before_update_s, after_update_s;
  std::vector<std::vector<int64_t>> link_bytes, link_before_update, link_after_update;
  int64_t bytes = 0, raw_bytes = 0;  // every replica and stage, per step
};

}  // namespace

// --data-parallel: every cell is a fresh ReplicatedPipeline (same seed) trained 1 + --steps steps;
// the first (warm-up) is not timed. The step ends when every stage's sync has (and what follows
// it: the optimizer, for fp32 and BitDP); the data-parallel links carry none of the pipeline's
// traffic, so the backward passes end when they do unshaped. Two bounds, the larger taken:
// - per stage s: its backward pass ends at the unshaped step minus its slowest unshaped sync
//   (which includes what follows the sync call); the sync then takes at least the larger of that
//   sync and the most bytes one of its replicas sends to one replica of another region, at the
//   rate (each directed pair of regions' replicas has the rate to itself, as longhaul-netem's
//   between_regions, so messages to different peers may overlap);
// - per replica r of stage s: no byte it sends can leave before its own sync starts, and its sync
//   call takes at least the larger of its unshaped one and its own busiest link's bytes at the rate
//   (the stage's bound lets a replica's link time pass while the first replica waits for it);
// - per replica, its chain, where its sync calls an update (SDP4Bit's and ZeRO++'s sharded
//   optimizer between the gradients' reduce-scatter and the weights' all-gather; BitDP's averaging
//   after its all-gather): from its start, the part before the update takes at least the larger of
//   its unshaped time and its bytes before the update at the rate, then the part after it the
//   larger of its unshaped time and its bytes after at the rate (SyncChainBound, link_bounds.h:
//   the update's own time left out). The replica's bound above lets the all-gather's bytes cross
//   during the reduce-scatter's.
// The step bound is the largest of all (the report also gives the fraction without the chains); the sync columns are its stage's (slowest replica) or
// replica's. fraction = bound / measured (1 = at the bound).
absl::StatusOr<DpCellShape> DpCellShapeOf(const SweepFlags& f, const CLI::App& cmd, int default_stages,
                                          int min_regions) {
  // The pipeline cells' flags: a data-parallel cell has fp32 pipeline links on this machine's CPUs,
  // shaped only between regions, in-process.
  for (const char* flag : {"--codecs", "--backward", "--device", "--precision", "--preset", "--codec-device", "--shaper",
                           "--tc", "--pace", "--queue-ms", "--svg", "--unshaped-repeats", "--tcp-congestion",
                           "--link-trace"}) {
    if (cmd.count(flag) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " is for the pipeline cells, not --data-parallel"));
    }
  }
  if (f.repeats < 1) return absl::InvalidArgumentError("--repeats must be at least 1");
  DpCellShape c;
  c.rates = cmd.count("--rates") ? f.rates : std::vector<double>{10, 100};
  c.stages = static_cast<int>(f.stages > 0 ? f.stages : default_stages);
  c.micro_batches = cmd.count("--micro-batches") ? f.micro_batches : 8;
  c.micro_batch_size = cmd.count("--micro-batch-size") ? f.micro_batch_size : 4;
  if (c.stages > f.layers) return absl::InvalidArgumentError("--stages must be at most --layers");
  absl::StatusOr<std::vector<int>> per_stage = CountsPerStage(f.dp_replicas, c.stages, c.micro_batches);
  if (!per_stage.ok()) return absl::InvalidArgumentError(absl::StrCat("--dp-replicas: ", per_stage.status().message()));
  c.replicas = *per_stage;
  c.regions = static_cast<int>(f.dp_regions);
  const int fewest = *std::min_element(c.replicas.begin(), c.replicas.end());
  if (fewest < 2 || c.regions < min_regions || c.regions > fewest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dp-replicas: every count at least 2 (a stage of one has no sync), and --dp-regions in [", min_regions,
        ", the fewest]", min_regions > 1 ? " (the links between regions are the shaped ones)" : ""));
  }
  for (double r : c.rates) {
    if (!(r > 0)) return absl::InvalidArgumentError(absl::StrCat("bad rate \"", r, "\" (rates are Mbit/s > 0)"));
  }
  return c;
}

int RunDpSweep(const SweepFlags& f, const CLI::App& cmd) {
  absl::StatusOr<DpCellShape> shape = DpCellShapeOf(f, cmd, /*default_stages=*/2, /*min_regions=*/1);
  if (!shape.ok()) return common::FlagError(cmd, std::string(shape.status().message()));
  const DpCellShape& grid = *shape;
  stage_runtime::PipelineOptions o;
  o.model = {static_cast<int>(f.layers), static_cast<int>(f.hidden), 4, static_cast<int>(f.context), 256};
  o.stages = grid.stages;
  o.micro_batches = static_cast<int>(grid.micro_batches);
  o.micro_batch_size = static_cast<int>(grid.micro_batch_size);
  o.schedule = f.schedule == "gpipe" ? stage_runtime::Schedule::kGPipe : stage_runtime::Schedule::k1F1B;
  o.optimizer.total_steps = static_cast<int>(f.steps + 1);
  auto data = stage_runtime::OpenDataset({"text", stage_runtime::kDefaultCorpusDir, 256, 0.1}, o.model.context);
  if (!data.ok()) return common::FlagError(cmd, std::string(data.status().message()));
  stage_runtime::SetComputeThreads(1);  // one compute thread per replica and stage already fill this machine
  common::TuneAllocatorForLargeFrames();  // as longhaul-worker does: steps reuse their buffers' pages
  auto cell = [&](const std::string& codec, double rate) -> absl::StatusOr<DpSample> {
    absl::StatusOr<collective::DpCodec> c = collective::ParseDpCodec(codec);
    if (!c.ok()) return c.status();
    netem::LinkProfile between;
    between.rate_bytes_per_s = rate * 1e6 / 8;
    auto p = ReplicatedPipeline::Create(o, grid.replicas, *c, grid.regions, 4, between);
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
        x.phase_starts_s.emplace_back();
        for (absl::Duration d : st.phase_starts) x.phase_starts_s.back().push_back(absl::ToDoubleSeconds(d));
        x.bucket_spans.push_back(BucketSpansText(st.bucket_spans));
        x.busiest_link_bytes.push_back(st.busiest_link);
        for (auto* v : {&x.start_s, &x.replica_sync_s, &x.before_update_s, &x.after_update_s}) v->emplace_back();
        for (auto* v : {&x.link_bytes, &x.link_before_update, &x.link_after_update}) v->emplace_back();
        for (const ReplicatedPipeline::ReplicaDp& r : st.replicas) {
          x.start_s.back().push_back(absl::ToDoubleSeconds(r.start));
          x.replica_sync_s.back().push_back(absl::ToDoubleSeconds(r.wall));
          const bool updates = r.update_start != absl::InfiniteDuration();
          x.before_update_s.back().push_back(updates ? absl::ToDoubleSeconds(r.update_start) : -1.0);
          x.after_update_s.back().push_back(updates ? absl::ToDoubleSeconds(r.wall - r.update_start - r.update) : 0.0);
          x.link_bytes.back().push_back(r.busiest_link);
          x.link_before_update.back().push_back(r.link_before_update);
          x.link_after_update.back().push_back(r.link_after_update);
        }
      }
      x.bytes = (*p)->last_dp().bytes_sent, x.raw_bytes = (*p)->last_dp().bytes_sent_uncompressed;
      steps.push_back(std::move(x));
    }
    DpSample mean;
    for (auto* v : {&mean.sync_s, &mean.update_s}) v->assign(static_cast<size_t>(grid.stages), 0.0);
    mean.phase_starts_s.assign(static_cast<size_t>(grid.stages), {});
    mean.bucket_spans.assign(static_cast<size_t>(grid.stages), std::string());
    mean.busiest_link_bytes.assign(static_cast<size_t>(grid.stages), 0);
    for (int s = 0; s < grid.stages; ++s) {
      for (auto* v : {&mean.start_s, &mean.replica_sync_s, &mean.before_update_s, &mean.after_update_s}) {
        v->emplace_back(static_cast<size_t>(grid.replicas[s]), 0.0);
      }
      for (auto* v : {&mean.link_bytes, &mean.link_before_update, &mean.link_after_update}) {
        v->emplace_back(static_cast<size_t>(grid.replicas[s]), 0);
      }
    }
    for (const DpSample& x : steps) {
      const double w = 1.0 / static_cast<double>(steps.size());
      mean.step_s += x.step_s * w;
      for (int s = 0; s < grid.stages; ++s) {
        mean.sync_s[s] += x.sync_s[s] * w;
        mean.update_s[s] += x.update_s[s] * w;
        std::vector<double>& ph = mean.phase_starts_s[s];
        ph.resize(std::max(ph.size(), x.phase_starts_s[s].size()), 0.0);
        for (size_t i = 0; i < x.phase_starts_s[s].size(); ++i) ph[i] += x.phase_starts_s[s][i] * w;
        mean.busiest_link_bytes[s] = std::max(mean.busiest_link_bytes[s], x.busiest_link_bytes[s]);
        for (int r = 0; r < grid.replicas[s]; ++r) {
          mean.start_s[s][r] += x.start_s[s][r] * w;
          mean.replica_sync_s[s][r] += x.replica_sync_s[s][r] * w;
          mean.before_update_s[s][r] += x.before_update_s[s][r] * w;  // -1 in every step, or in none
          mean.after_update_s[s][r] += x.after_update_s[s][r] * w;
          mean.link_bytes[s][r] = std::max(mean.link_bytes[s][r], x.link_bytes[s][r]);
          mean.link_before_update[s][r] = std::max(mean.link_before_update[s][r], x.link_before_update[s][r]);
          mean.link_after_update[s][r] = std::max(mean.link_after_update[s][r], x.link_after_update[s][r]);
        }
      }
      mean.bytes = x.bytes, mean.raw_bytes = x.raw_bytes;
      mean.bucket_spans = x.bucket_spans;  // the last step's
      mean.last_start_spread_s.clear();
      for (const std::vector<double>& starts : x.start_s) mean.last_start_spread_s.push_back(Spread(starts));
    }
    return mean;
  };
  std::map<std::pair<double, std::string>, std::vector<DpSample>> samples;
  for (int64_t rep = 0; rep < f.repeats; ++rep) {
    for (double rate : grid.RoundRates()) {
      for (const std::string& c : f.dp_codecs) {
        absl::StatusOr<DpSample> x = cell(c, rate);
        if (!x.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s at %g Mbit/s: %s\n", c.c_str(), rate,
                       std::string(x.status().message()).c_str());
          return 1;
        }
        if (!f.json) {
          std::string per_stage;
          for (int s = 0; s < grid.stages; ++s) {
            // (fp32 syncs through Group::AllReduceFp32 and the executor's optimizer: no update time)
            std::string update =
                x->update_s[s] > 0 ? absl::StrFormat("%.3f s in the update; ", x->update_s[s]) : std::string();
            if (!x->phase_starts_s[s].empty()) {
              absl::StrAppend(&update, "its phases began at ",
                              absl::StrJoin(x->phase_starts_s[s], "/",
                                            [](std::string* o, double v) { absl::StrAppendFormat(o, "%.4f", v); }),
                              " s; ");
            }
            if (!x->bucket_spans[s].empty()) absl::StrAppend(&update, "its buckets ", x->bucket_spans[s], "; ");
            absl::StrAppendFormat(&per_stage,
                                  "%s stage %d %.3f s (%s%lld bytes on its busiest link between regions; its "
                                  "replicas' syncs started within %.3f s on average, %.3f s in the last step)",
                                  s ? "," : "", s, x->sync_s[s], update, static_cast<long long>(x->busiest_link_bytes[s]),
                                  Spread(x->start_s[s]), x->last_start_spread_s[s]);
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
    return MedianOf(samples.at({rate, c}), field);
  };
  auto step_of = [](const DpSample& x) { return x.step_s; };
  auto of = [](std::vector<std::vector<double>> DpSample::*field, int s, int r) {
    return [field, s, r](const DpSample& x) { return (x.*field)[s][r]; };
  };
  auto of_stage = [](std::vector<double> DpSample::*field, int s) {
    return [field, s](const DpSample& x) { return (x.*field)[s]; };
  };
  std::string md = absl::StrFormat(
      "| between regions Mbit/s | data-parallel codec | step s | step bound s | step fraction of bound "
      "(without the chains) | bounding stage, replica | its sync's start after its stage's first s (unshaped) | its sync s | its sync bound s | "
      "its sync's fraction of bound | slowest sync s (any stage) | "
      "KB on the busiest link between regions, per step | data-parallel KB per step, all replicas / as fp32 | "
      "sync speed-up vs fp32 | step speed-up vs fp32 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  // The slowest replica's sync of any stage.
  auto slowest_sync = [](const DpSample& x) { return *std::max_element(x.sync_s.begin(), x.sync_s.end()); };
  for (double rate : grid.rates) {
    for (const std::string& c : f.dp_codecs) {
      const DpSample& any = samples.at({rate, c}).front();
      const double step = median(rate, c, step_of), slowest = median(rate, c, slowest_sync);
      // The largest bound of any stage (replica -1: the stage's, from its slowest sync) or replica.
      struct Bounding {
        double step_bound = 0, sync_bound = 0, sync = 0, after_first = 0;
        int stage = 0, replica = -1;
        bool chain = false;
      } b;
      double without_chain = 0;  // the largest bound but the chains
      auto consider = [&](Bounding x) {
        if (x.step_bound > b.step_bound) b = x;
        if (!x.chain) without_chain = std::max(without_chain, x.step_bound);
      };
      const double unshaped_step = median(0, c, step_of);
      for (int s = 0; s < grid.stages; ++s) {
        // The stage's: its backward pass ends at the unshaped step minus its slowest unshaped sync,
        // which also counts what follows the sync call in the step.
        const double slowest_unshaped = median(0, c, of_stage(&DpSample::sync_s, s));
        const double stage_link_s = static_cast<double>(any.busiest_link_bytes[s]) / (rate * 1e6 / 8);
        const double stage_sync = std::max(slowest_unshaped, stage_link_s);
        consider({unshaped_step - slowest_unshaped + stage_sync, stage_sync, median(rate, c, of_stage(&DpSample::sync_s, s)),
                  0, s, -1});
        // Each replica's: from its own start, which none of its bytes can precede.
        std::vector<double> start(static_cast<size_t>(grid.replicas[s]));
        for (int r = 0; r < grid.replicas[s]; ++r) start[r] = median(0, c, of(&DpSample::start_s, s, r));
        const double first = *std::min_element(start.begin(), start.end());
        for (int r = 0; r < grid.replicas[s]; ++r) {
          SyncFigures sf;
          sf.sync = median(0, c, of(&DpSample::replica_sync_s, s, r));
          sf.before_update = median(0, c, of(&DpSample::before_update_s, s, r));
          sf.after_update = median(0, c, of(&DpSample::after_update_s, s, r));
          sf.link_bytes = any.link_bytes[s][r];
          sf.link_bytes_before_update = any.link_before_update[s][r];
          sf.link_bytes_after_update = any.link_after_update[s][r];
          const double measured = median(rate, c, of(&DpSample::replica_sync_s, s, r));
          const double sync_s = SyncBound(sf, rate * 1e6 / 8), chain = SyncChainBound(sf, rate * 1e6 / 8);
          consider({start[r] + sync_s, sync_s, measured, start[r] - first, s, r});
          if (chain > 0) consider({start[r] + chain, chain, measured, start[r] - first, s, r, true});
        }
      }
      const double step_bound = b.step_bound, sync_bound = b.sync_bound, sync = b.sync;
      const int64_t busiest = *std::max_element(any.busiest_link_bytes.begin(), any.busiest_link_bytes.end());
      const bool has_fp32 = samples.count({rate, "fp32"}) > 0;
      const double fp32_step = has_fp32 ? median(rate, "fp32", step_of) : 0;
      const double fp32_slowest = has_fp32 ? median(rate, "fp32", slowest_sync) : 0;
      absl::StrAppendFormat(
          &md, "| %g | %s | %.3f | %.3f | %.2f (%.2f) | %d, %s | %s | %.3f | %.3f | %.2f | %.3f | %.1f | %.0f / %.0f | %s | %s |\n",
          rate, c, step, step_bound, step_bound / step, without_chain / step, b.stage,
          b.replica < 0 ? std::string("slowest") : absl::StrCat(b.replica, b.chain ? " (chain)" : ""),
          b.replica < 0 ? std::string("-") : absl::StrFormat("%.3f", b.after_first), sync, sync_bound, sync_bound / sync,
          slowest,
          busiest / 1e3, any.bytes / 1e3, any.raw_bytes / 1e3,
          has_fp32 ? absl::StrFormat("%.2fx", fp32_slowest / slowest) : "-",
          has_fp32 ? absl::StrFormat("%.2fx", fp32_step / step) : "-");
      rows.push_back({{"rate_mbit", rate}, {"dp_codec", c}, {"step_s", Round(step, 4)},
                      {"step_bound_s", Round(step_bound, 4)}, {"step_fraction", Round(step_bound / step, 3)},
                      {"step_fraction_without_chains", Round(without_chain / step, 3)},
                      {"bounding_stage", b.stage},
                      {"bounding_kind", b.replica < 0 ? "stage" : b.chain ? "chain" : "replica"},
                      {"bounding_replica", b.replica < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(b.replica)},
                      {"bounding_replica_start_after_first_s",
                       b.replica < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(Round(b.after_first, 4))},
                      {"bounding_sync_s", Round(sync, 4)},
                      {"bounding_sync_bound_s", Round(sync_bound, 4)},
                      {"bounding_sync_fraction", Round(sync_bound / sync, 3)},
                      {"slowest_sync_s", Round(slowest, 4)},
                      {"busiest_link_bytes", busiest}, {"stage_busiest_link_bytes", any.busiest_link_bytes},
                      {"dp_bytes_per_step", any.bytes}, {"dp_raw_bytes_per_step", any.raw_bytes},
                      {"slowest_sync_speedup_vs_fp32", Round(has_fp32 ? fp32_slowest / slowest : 0.0, 3)},
                      {"step_speedup_vs_fp32", Round(has_fp32 ? fp32_step / step : 0.0, 3)}});
    }
  }
  return PrintDpCells(f, md, rows);
}

int PrintDpCells(const SweepFlags& f, const std::string& md, const nlohmann::ordered_json& rows) {
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
