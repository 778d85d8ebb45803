// `longhaul-bench sweep`'s flags (sweep_bench.cc declares and parses them), shared with the
// data-parallel cells (dp_sweep_bench.cc, --data-parallel; dp_process_sweep.cc, with --processes).
#ifndef LONGHAUL_BENCH_SWEEP_FLAGS_H_
#define LONGHAUL_BENCH_SWEEP_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

#include "netem/tc/network.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::bench {

struct SweepFlags {
  std::vector<double> rates = {2, 10, 100};
  std::vector<std::string> codecs = {"fp32", "fp16", "int4", "tahquant"};
  std::string backward = "auto", schedule = "gpipe", shaper = "auto", markdown, svg;
  std::string link_trace;  // tc: every cell's link samples and step times, as CSV (--link-trace)
  int64_t steps = 4, layers = 4, hidden = 128, context = 32, micro_batches = 128, micro_batch_size = 1;
  // GPU runs: a GPT-2 preset's sizes (layers, context still from the flags when given), the
  // workers' devices (dealt to them in turn), the stages' precision and where the links' codecs run.
  std::string preset, precision = "fp32", codec_device = "auto";
  std::vector<std::string> devices = {"cpu"};
  int64_t stages = 0;  // 0: one per layer
  int64_t repeats = 3, queue_ms = 3000;
  // The unshaped cells (the compute bounds) measured this many times, at least --repeats: one
  // unshaped round moved by a fifth on one GPU machine (docs/gpu-sweep.md), and they are quick.
  int64_t unshaped_repeats = 0;
  // tc: the workers pace what they send on each link (the job's links.pace_mbit) at this fraction of
  // the TCP payload the rate carries (netem::TcpPayloadMbit; not the probe's goodput, which one
  // disturbed probe would put far below it); 0: unpaced.
  double pace = 0.98;
  std::string tcp_congestion = netem::Topology().tcp_congestion;  // tc: the hosts' congestion control
  bool tc = false, json = false;
  // --data-parallel
  bool data_parallel = false;
  std::vector<std::string> dp_codecs = {"fp32", "sdp4bit", "bitdp2"};
  std::vector<int> dp_replicas = {4};  // every stage's, or one per stage
  int64_t dp_regions = 2;
  bool processes = false;  // as jobs of worker processes (dp_process_sweep.cc)
};

// The data-parallel cells' shape from the flags, both drivers' (dp_sweep_bench.cc): rates (default
// 10, 100 Mbit/s), stages (default `default_stages`), micro-batches (default 8 of 4 sequences),
// replicas per stage (every count at least 2) and regions (at least `min_regions`, at most the
// fewest replicas). An error says which flag is wrong.
struct DpCellShape {
  std::vector<double> rates;
  int stages = 0;
  int64_t micro_batches = 0, micro_batch_size = 0;
  std::vector<int> replicas;  // per stage
  int regions = 0;
  // A round's rates: unshaped (0) first, then `rates`.
  std::vector<double> RoundRates() const {
    std::vector<double> all = {0};
    all.insert(all.end(), rates.begin(), rates.end());
    return all;
  }
};
absl::StatusOr<DpCellShape> DpCellShapeOf(const SweepFlags& f, const CLI::App& cmd, int default_stages,
                                          int min_regions);

// --data-parallel: the data-parallel cells (dp_sweep_bench.cc). `cmd` says which flags were given
// (the cells have their own defaults for the others).
int RunDpSweep(const SweepFlags& f, const CLI::App& cmd);
// --data-parallel --processes: the same cells as jobs of worker processes (dp_process_sweep.cc).
int RunDpProcessSweep(const SweepFlags& f, const CLI::App& cmd);
// The cells' table (markdown, or {"runs": rows} with --json) on stdout, and to --markdown.
int PrintDpCells(const SweepFlags& f, const std::string& md, const nlohmann::ordered_json& rows);

// Ctrl-C / SIGTERM while a sweep runs: stops the cluster's processes and removes the network
// namespaces of `net` (none: nullptr) before the process leaves (its main thread may be waiting on a
// job for minutes). Declared after the cluster and the network, so destroyed before them: from
// then on a signal only ends the process (the watching thread, detached, outlives the sweep, and
// holds the shared state, not the cluster). A signal being handled holds the state's lock until
// the process exits, so the destructor cannot free the cluster under it. One a process (each
// watching thread reads the one signal pipe). A signal after the guard is gone (while the
// cluster's destructor waits for its processes, up to about 20 s, or the namespaces come down)
// ends the process at once: workers still exiting may be orphaned and the namespaces left, which
// the next sweep removes first.
class StopClusterOnTermination {
 public:
  StopClusterOnTermination(cluster::Cluster& cl, netem::Network* net);
  ~StopClusterOnTermination();
  StopClusterOnTermination(const StopClusterOnTermination&) = delete;
  StopClusterOnTermination& operator=(const StopClusterOnTermination&) = delete;

 private:
  struct Target;  // the cluster and network under a lock, shared with the watching thread
  std::shared_ptr<Target> target_;
};
// Starts the cluster's coordinator and `workers` workers; false after printing why it could not
// (and the workers' logs when they did not start).
bool StartSweepCluster(cluster::Cluster& cl, int workers);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_SWEEP_FLAGS_H_
