// longhaul-bench sweep --data-parallel --processes: the data-parallel cells as jobs of real worker
// processes over gRPC. A local cluster (tools/cluster/local_cluster.h): a coordinator and one
// longhaul-worker per replica of every stage, dealt to --dp-regions regions in turn (--region);
// each cell is a job whose replicas synchronise with the cell's codec, the links between regions
// shaped by the workers' in-process shaper at the cell's rate (links.between_regions_mbit), the
// others unshaped. --stages defaults to 1 here: then every byte between regions is the replicas'
// synchronisation (a pipeline's links between regions would be shaped too).
//
// Per job, from the coordinator's status: tokens/s (start-up left out) and, of the latest step, the
// slowest stage's sync, the data-parallel bytes of every replica and the most one replica sent to
// one replica of another region, and each replica's sync in parts (StagePlacement.dp_sync). Rounds
// interleaved (unshaped first in each), medians reported. Bounds, the largest taken:
// - the job's: the unshaped step minus its slowest sync, plus the larger of that sync and the
//   busiest link's bytes at the rate;
// - each replica's: its own step less its sync (the same step of an unshaped job), plus the larger
//   of that sync and its busiest link's bytes at the rate, or its chain where its sync has an
//   update (SyncBound and SyncChainBound, link_bounds.h, as the in-process cells); per unshaped
//   job, then the median over them.
// fraction = bound / measured; the table gives it without the chains too.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/benchmarks.h"
#include "bench/link_bounds.h"
#include "bench/sweep_flags.h"
#include "common/flags.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::bench {
namespace {

// One replica's sync in its latest step (StagePlacement.dp_sync).
struct ReplicaSample {
  SyncFigures sync;
  double step_s = 0;  // the step that holds it
  std::string name;   // "stage 0 replica 1"
};

// One job's figures.
struct ProcessSample {
  double tokens_per_s = 0, sync_s = 0;
  int64_t bytes = 0, raw_bytes = 0, busiest_link = 0;  // data-parallel, per step
  std::vector<ReplicaSample> replicas;                 // JobStatus.stages' order (slots)
};

SyncFigures FiguresOf(const v1::DpSyncFigures& d) {
  SyncFigures f;
  f.sync = d.seconds();
  f.link_bytes = d.busiest_link_bytes();
  if (d.has_update()) {
    f.before_update = d.before_update_seconds();
    f.after_update = std::max(0.0, d.seconds() - d.before_update_seconds() - d.update_seconds());
    f.link_bytes_before_update = d.busiest_link_bytes_before_update();
    f.link_bytes_after_update = d.busiest_link_bytes_after_update();
  }
  return f;
}

}  // namespace

int RunDpProcessSweep(const SweepFlags& f, const CLI::App& cmd) {
  absl::StatusOr<DpCellShape> shape = DpCellShapeOf(f, cmd, /*default_stages=*/1, /*min_regions=*/2);
  if (!shape.ok()) return common::FlagError(cmd, std::string(shape.status().message()));
  const DpCellShape& grid = *shape;
  int workers = 0;
  for (int c : grid.replicas) workers += c;
  const std::string replicas =
      std::all_of(grid.replicas.begin(), grid.replicas.end(), [&](int c) { return c == grid.replicas[0]; })
          ? absl::StrCat(grid.replicas[0])
          : absl::StrCat("[", absl::StrJoin(grid.replicas, ", "), "]");
  const double tokens_per_step = static_cast<double>(grid.micro_batches * grid.micro_batch_size * f.context);

  cluster::Cluster cl(1);
  std::vector<std::string> regions;
  for (int y = 0; y < grid.regions; ++y) regions.push_back(absl::StrCat("region-", y));
  cl.SetWorkerRegions(regions);
  const StopClusterOnTermination stop_on_signal(cl, nullptr);
  if (!StartSweepCluster(cl, workers)) return 1;
  if (!f.json) {
    std::fprintf(stderr, "%d worker processes in %d regions: %d stage%s x replicas %s\n", workers, grid.regions,
                 grid.stages, grid.stages == 1 ? "" : "s", replicas.c_str());
  }
  auto run = [&](const std::string& codec, double rate) -> absl::StatusOr<ProcessSample> {
    const std::string yaml = absl::StrFormat(
        "name: dp-sweep-%s-%g\nmodel: {layers: %d, hidden: %d, heads: 4, context: %d}\nstages: %d\nreplicas: %s\n"
        "micro_batches: %d\nmicro_batch_size: %d\nschedule: %s\nsteps: %d\ndata_parallel: {codec: %s}\n"
        "links: {between_regions_mbit: %g}\ncheckpoint: {replicate: none}\n",
        codec, rate, f.layers, f.hidden, f.context, grid.stages, replicas, grid.micro_batches, grid.micro_batch_size,
        f.schedule, f.steps, codec, rate);
    absl::StatusOr<uint64_t> job = cl.Submit(yaml);
    if (!job.ok()) return job.status();
    absl::StatusOr<v1::JobStatus> st = cl.WaitForEnd(*job, absl::Minutes(10));
    if (!st.ok()) return st.status();
    if (st->state() != v1::JOB_STATE_SUCCEEDED) return absl::InternalError(st->error());
    ProcessSample x{st->tokens_per_s(), st->dp_seconds(), st->dp_bytes_per_step(), st->dp_raw_bytes_per_step(),
                    st->dp_busiest_link_bytes(), {}};
    for (const v1::StagePlacement& p : st->stages()) {
      x.replicas.push_back(
          {FiguresOf(p.dp_sync()), p.dp_sync().step_seconds(), absl::StrCat("stage ", p.stage(), " replica ", p.replica())});
    }
    return x;
  };
  std::map<std::pair<double, std::string>, std::vector<ProcessSample>> samples;
  for (int64_t rep = 0; rep < f.repeats; ++rep) {
    for (double rate : grid.RoundRates()) {
      for (const std::string& c : f.dp_codecs) {
        const std::string where = rate > 0 ? absl::StrCat(rate, " Mbit/s between regions") : "unshaped";
        absl::StatusOr<ProcessSample> x = run(c, rate);
        if (!x.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s, %s: %s\n", c.c_str(), where.c_str(),
                       std::string(x.status().message()).c_str());
          cl.DumpLogs();
          return 1;
        }
        if (!f.json) {
          std::fprintf(stderr, "round %lld: %s, %s: %.0f tokens/s, sync %.3f s, %lld bytes on the busiest link\n",
                       static_cast<long long>(rep + 1), where.c_str(), c.c_str(), x->tokens_per_s, x->sync_s,
                       static_cast<long long>(x->busiest_link));
        }
        samples[{rate, c}].push_back(*x);
      }
    }
  }
  auto tokens = [](const ProcessSample& s) { return s.tokens_per_s; };
  auto sync = [](const ProcessSample& s) { return s.sync_s; };
  std::string md =
      "| between regions Mbit/s | data-parallel codec | tokens/s | step s | step bound s | step fraction of bound "
      "(without the chains) | bounding | sync s (slowest stage, last step) | KB on the busiest link between regions, "
      "per step | data-parallel KB per step, all replicas / as fp32 | sync speed-up vs fp32 | step speed-up vs fp32 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (double rate : grid.rates) {
    for (const std::string& c : f.dp_codecs) {
      const std::vector<ProcessSample>& cell = samples.at({rate, c});
      const std::vector<ProcessSample>& unshaped = samples.at({0, c});
      const double step = tokens_per_step / MedianOf(cell, tokens), sync_s = MedianOf(cell, sync);
      const double unshaped_step = tokens_per_step / MedianOf(unshaped, tokens), unshaped_sync = MedianOf(unshaped, sync);
      const ProcessSample& any = cell.front();  // the bytes do not change between jobs
      const double bytes_per_s = rate * 1e6 / 8;
      double step_bound =
          unshaped_step - unshaped_sync + std::max(unshaped_sync, static_cast<double>(any.busiest_link) / bytes_per_s);
      double without_chains = step_bound;
      std::string bounding = "job";
      for (size_t k = 0; k < any.replicas.size(); ++k) {
        // Replica k's bound from each unshaped job's figures of its step (its bytes: this cell's),
        // then the median over those jobs.
        std::vector<double> with, without;
        int chains = 0;
        for (const ProcessSample& u : unshaped) {
          if (k >= u.replicas.size()) continue;
          SyncFigures r = u.replicas[k].sync;
          const SyncFigures& bytes = any.replicas[k].sync;
          r.link_bytes = bytes.link_bytes;
          r.link_bytes_before_update = bytes.link_bytes_before_update;
          r.link_bytes_after_update = bytes.link_bytes_after_update;
          const double own = SyncBound(r, bytes_per_s), chain = SyncChainBound(r, bytes_per_s);
          with.push_back(u.replicas[k].step_s - r.sync + std::max(own, chain));
          without.push_back(u.replicas[k].step_s - r.sync + own);
          chains += chain > own ? 1 : 0;
        }
        if (with.empty()) continue;
        const double b = Median(with);
        without_chains = std::max(without_chains, Median(without));
        if (b > step_bound) {
          step_bound = b;
          bounding = absl::StrCat(any.replicas[k].name, 2 * chains > static_cast<int>(with.size()) ? " (chain)" : "");
        }
      }
      const bool has_fp32 = samples.count({rate, "fp32"}) > 0;
      const double fp32_step = has_fp32 ? tokens_per_step / MedianOf(samples.at({rate, "fp32"}), tokens) : 0;
      const double fp32_sync = has_fp32 ? MedianOf(samples.at({rate, "fp32"}), sync) : 0;
      absl::StrAppendFormat(&md, "| %g | %s | %.0f | %.3f | %.3f | %.2f (%.2f) | %s | %.3f | %.1f | %.0f / %.0f | %s | %s |\n",
                            rate, c, tokens_per_step / step, step, step_bound, step_bound / step, without_chains / step,
                            bounding, sync_s, any.busiest_link / 1e3, any.bytes / 1e3, any.raw_bytes / 1e3,
                            has_fp32 ? absl::StrFormat("%.2fx", fp32_sync / sync_s) : "-",
                            has_fp32 ? absl::StrFormat("%.2fx", fp32_step / step) : "-");
      rows.push_back({{"rate_mbit", rate}, {"dp_codec", c}, {"tokens_per_s", Round(tokens_per_step / step, 1)},
                      {"step_s", Round(step, 4)}, {"step_bound_s", Round(step_bound, 4)},
                      {"step_fraction", Round(step_bound / step, 3)},
                      {"step_fraction_without_chains", Round(without_chains / step, 3)}, {"bounding", bounding},
                      {"sync_s", Round(sync_s, 4)}, {"busiest_link_bytes", any.busiest_link},
                      {"dp_bytes_per_step", any.bytes}, {"dp_raw_bytes_per_step", any.raw_bytes},
                      {"sync_speedup_vs_fp32", Round(has_fp32 ? fp32_sync / sync_s : 0.0, 3)},
                      {"step_speedup_vs_fp32", Round(has_fp32 ? fp32_step / step : 0.0, 3)}});
    }
  }
  absl::StrAppendFormat(&md, "\n%d worker processes over gRPC in %d regions; the median of %lld job%s per cell.\n",
                        workers, grid.regions, static_cast<long long>(f.repeats), f.repeats == 1 ? "" : "s");
  return PrintDpCells(f, md, rows);
}

}  // namespace longhaul::bench
