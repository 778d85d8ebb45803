// longhaul-bench sweep: the TAH-Quant paper's throughput-vs-bandwidth table with our system. Starts
// a local cluster (coordinator + one worker process per stage), then trains the same small job at
// several link rates with several forward codecs, links shaped by the in-process shaper
// (netem/shaper.h), and reports tokens/s next to the two bounds that limit it:
//   compute bound: the same codec with unshaped links, measured in this run;
//   link bound:    tokens per step / (bytes per step on the busiest link direction / rate),
//                  from the frame sizes of the codecs on tensors of the job's activation shape.
// Writes the tables (sweep_report.h) to --markdown and an SVG plot (--svg).
//
// --data-parallel: the data-parallel cells instead (dp_sweep_bench.cc).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/benchmarks.h"
#include "bench/link_bounds.h"
#include "bench/link_timeline.h"
#include "bench/sweep_flags.h"
#include "bench/sweep_plot.h"
#include "bench/sweep_report.h"
#include "codec/codec.h"
#include "netem/tc/claim.h"
#include "netem/tc/network.h"
#include "stage_runtime/data.h"
#include "stage_runtime/model_presets.h"
#include "common/flags.h"
#include "common/list_dir.h"
#include "common/signals.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::bench {
namespace {

// How long a tc sweep waits for another one (its network has the same name) to end: long enough
// for a stopped one to stop its workers and remove its namespaces.
constexpr absl::Duration kClaimPatience = absl::Minutes(2);
std::string ClaimPatienceText() { return absl::StrCat(absl::ToInt64Minutes(kClaimPatience), " minutes"); }

// One training job's outcome.
struct Sample {
  double tokens_per_s = 0;
  double busiest_link_bytes = 0;  // tc: the largest qdisc byte count of any host's up or down link
  double drops = 0;               // tc: packets dropped by all the qdiscs
  // tc: the busiest link direction in steps 2..N-1 ("w1 (stage 1) up"), its share of that window
  // busy and idle by gap length, and its gaps per step.
  IdleShares idle;
};


std::string BackwardFor(const std::string& fwd, const std::string& mode) {
  const bool raw = fwd == "fp32" || fwd == "fp16" || fwd == "bf16";
  if (raw) return fwd;
  return mode == "auto" ? "int4" : mode;
}

// Bytes of one encoded micro-batch tensor [mbs, context, hidden] (sizes depend only on the shape
// for every codec here; the content is a stand-in).
absl::StatusOr<int64_t> FrameBytes(const std::string& spec, int64_t mbs, int64_t ctx, int64_t hidden) {
  auto c = codec::MakeCodec(spec);
  if (!c.ok()) return c.status();
  torch::manual_seed(1);
  auto f = (*c)->Encode(torch::randn({mbs, ctx, hidden}));
  if (!f.ok()) return f.status();
  return static_cast<int64_t>(f->size());
}

}  // namespace

struct StopClusterOnTermination::Target {
  absl::Mutex mu;
  cluster::Cluster* cl ABSL_GUARDED_BY(mu);
  netem::Network* net ABSL_GUARDED_BY(mu);
};

StopClusterOnTermination::StopClusterOnTermination(cluster::Cluster& cl, netem::Network* net)
    : target_(std::make_shared<Target>()) {
  {
    absl::MutexLock l(&target_->mu);
    target_->cl = &cl;
    target_->net = net;
  }
  if (!common::InstallTerminationHandlers()) return;
  std::thread([t = target_] {
    const int sig = common::WaitForTerminationSignal();
    absl::MutexLock l(&t->mu);  // held until _exit: the sweep's destructor waits for it
    if (t->cl != nullptr) {
      std::fprintf(stderr, "longhaul-bench sweep: %s: stopping the cluster%s\n", common::SignalName(sig),
                   t->net ? " and removing the network namespaces" : "");
      t->cl->SignalAll(SIGTERM);
      absl::SleepFor(absl::Seconds(2));
      t->cl->SignalAll(SIGKILL);
      if (t->net) (void)t->net->Down();
    }
    _exit(128 + sig);
  }).detach();
}

StopClusterOnTermination::~StopClusterOnTermination() {
  absl::MutexLock l(&target_->mu);
  target_->cl = nullptr;
  target_->net = nullptr;
}

bool StartSweepCluster(cluster::Cluster& cl, int workers) {
  absl::Status s = cl.StartCoordinator();
  if (s.ok()) {
    s = cl.StartWorkers(workers);
    if (!s.ok()) cl.DumpLogs();
  }
  if (!s.ok()) std::fprintf(stderr, "longhaul-bench sweep: %s\n", std::string(s.message()).c_str());
  return s.ok();
}

namespace {

int RunSweep(const SweepFlags& f, const CLI::App& cmd) {
  const bool congestion_given = cmd.get_option("--tcp-congestion")->count() > 0;
  if (f.steps < 1) return common::FlagError(cmd, "--steps must be at least 1");
  if (f.processes && !f.data_parallel) return common::FlagError(cmd, "--processes is for --data-parallel cells");
  if (f.data_parallel) return f.processes ? RunDpProcessSweep(f, cmd) : RunDpSweep(f, cmd);
  if (absl::Status s = netem::CheckCongestion(f.tcp_congestion); !s.ok()) {
    return common::FlagError(cmd, absl::StrCat("--tcp-congestion: ", s.message()));
  }
  const std::vector<double>& rates = f.rates;
  for (double r : rates) {
    if (!(r > 0)) return common::FlagError(cmd, absl::StrCat("bad rate \"", r, "\" (rates are Mbit/s > 0)"));
  }
  const std::vector<std::string>& codecs = f.codecs;
  const std::string& backward = f.backward;
  const std::string& schedule = f.schedule;
  if (schedule != "gpipe" && schedule != "1f1b") return common::FlagError(cmd, "--schedule must be gpipe or 1f1b");
  if (f.repeats < 1) return common::FlagError(cmd, "--repeats must be at least 1");
  if (f.unshaped_repeats < 0) return common::FlagError(cmd, "--unshaped-repeats must be at least 0");
  const int64_t unshaped_rounds = std::max(f.repeats, f.unshaped_repeats);
  if (f.queue_ms < 1 || f.queue_ms > 60000) return common::FlagError(cmd, "--queue-ms must be in [1, 60000]");
  if (!(f.pace >= 0 && f.pace <= 1)) return common::FlagError(cmd, "--pace must be in [0, 1]");
  const bool json = f.json;
  const int stages = static_cast<int>(f.stages > 0 ? f.stages : f.layers);
  if (stages < 1 || stages > f.layers) return common::FlagError(cmd, "--stages must be in [1, --layers]");
  int64_t hidden = f.hidden;
  std::string model = absl::StrFormat("{layers: %d, hidden: %d, heads: 4, context: %d}", f.layers, f.hidden, f.context);
  if (!f.preset.empty()) {
    const stage_runtime::ModelPreset* mp = stage_runtime::FindModelPreset(f.preset);
    if (mp == nullptr) return common::FlagError(cmd, absl::StrCat("unknown --preset \"", f.preset, "\""));
    hidden = mp->hidden;
    model = absl::StrFormat("{preset: %s, layers: %d, context: %d}", f.preset, f.layers, f.context);
  }
  const double tokens_per_step = static_cast<double>(f.micro_batches * f.micro_batch_size * f.context);

  std::map<std::string, std::pair<int64_t, int64_t>> frame;  // codec -> (forward, backward) bytes
  for (const std::string& c : codecs) {
    auto fb = FrameBytes(c, f.micro_batch_size, f.context, hidden);
    auto bb = FrameBytes(BackwardFor(c, backward), f.micro_batch_size, f.context, hidden);
    if (!fb.ok() || !bb.ok()) {
      return common::FlagError(cmd, absl::StrCat("codec ", c, ": ", (fb.ok() ? bb.status() : fb.status()).message()));
    }
    frame[c] = {*fb, *bb};
  }

  const std::string shaper = f.tc ? "tc" : f.shaper;
  if (shaper != "auto" && shaper != "tc" && shaper != "inprocess") {
    return common::FlagError(cmd, "--shaper must be auto, tc or inprocess");
  }
  const bool tc = shaper == "tc" || (shaper == "auto" && geteuid() == 0);
  if (!tc && congestion_given) {
    return common::FlagError(cmd, "--tcp-congestion is for tc shaping (--shaper=tc, or auto as root); the in-process "
                                  "shaper's links take this machine's congestion control");
  }
  if (!f.link_trace.empty()) {
    if (!tc || f.steps < 3) return common::FlagError(cmd, "--link-trace needs tc shaping and --steps of 3 or more");
    if (std::remove(f.link_trace.c_str()) != 0 && errno != ENOENT) {
      return common::FlagError(cmd, absl::StrCat("--link-trace: cannot replace ", f.link_trace, ": ", std::strerror(errno)));
    }
  }
  if (!json) {
    std::fprintf(stderr, "shaping links with %s%s\n", tc ? "tc tbf in network namespaces" : "the in-process shaper",
                 tc && f.pace > 0
                     ? absl::StrFormat("; senders paced at %g of the TCP payload each rate carries", f.pace).c_str()
                     : "");
  }
  std::optional<netem::NetworkClaim> claim;  // outlives the network's removal below
  std::unique_ptr<netem::Network> net;
  netem::Topology topo;
  if (tc) {
    if (geteuid() != 0) return common::FlagError(cmd, "--shaper=tc needs root (network namespaces and tc)");
    topo.name = "lhsw";
    // Another sweep's namespaces have this name: wait for it rather than remove them under it.
    auto waiting = [&topo](int64_t pid) {
      std::fprintf(stderr, "waiting up to %s for %s to let go of network %s\n", ClaimPatienceText().c_str(),
                   pid > 0 ? absl::StrCat("process ", pid).c_str() : "another process", topo.name.c_str());
    };
    absl::StatusOr<netem::NetworkClaim> c = netem::NetworkClaim::Acquire(topo.name, kClaimPatience, waiting);
    if (!c.ok()) {
      std::fprintf(stderr, "longhaul-bench sweep: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    claim.emplace(*std::move(c));
    topo.subnet = "10.79.0";
    topo.hosts.push_back({"coord"});
    for (int i = 0; i < stages; ++i) topo.hosts.push_back({absl::StrCat("w", i)});
    for (netem::HostSpec& h : topo.hosts) h.queue_ms = static_cast<double>(f.queue_ms);
    topo.tcp_congestion = f.tcp_congestion;
    net = std::make_unique<netem::Network>(topo, netem::RunCommand);
    (void)net->Down();  // leftovers of an interrupted run
    if (absl::Status s = net->Up(); !s.ok()) {
      std::fprintf(stderr, "longhaul-bench sweep: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  // Removes the namespaces however this function returns (after the cluster's processes exit).
  struct NetDown {
    netem::Network* n;
    ~NetDown() {
      if (n) (void)n->Down();
    }
  } net_down{net.get()};
  cluster::Cluster cl(1);
  if (f.devices != std::vector<std::string>{"cpu"}) cl.SetWorkerDevices(f.devices);
  const StopClusterOnTermination stop_on_signal(cl, net.get());
  if (tc) {
    auto host = [&topo](const std::string& role) { return role == "coordinator" ? std::string("coord") : role; };
    cl.SetPlacement({[&topo, host](const std::string& r) { return topo.Namespace(host(r)); },
                     [&topo, host](const std::string& r) { return topo.Address(host(r)); }});
  }
  if (!StartSweepCluster(cl, stages)) return 1;
  // One job of codec `c` at `rate` (0: unshaped), in sweep round `round` (from 1; the link trace's).
  auto run = [&](const std::string& c, double rate, int64_t round) -> absl::StatusOr<Sample> {
    if (tc) {
      if (absl::Status s = net->SetRate(rate); !s.ok()) return s;
    }
    const double inproc_rate = tc ? 0.0 : rate;
    // No checkpoint copies: they would cross the shaped links between jobs' steps (gigabytes for a
    // gpt2-xl stage). The final checkpoint is still written; its time is not in tokens/s.
    const std::string yaml = absl::StrFormat(
        "name: sweep-%s-%g\nmodel: %s\nstages: %d\nprecision: %s\n"
        "micro_batches: %d\nmicro_batch_size: %d\nschedule: %s\ncodecs: {forward: \"%s\", backward: \"%s\"}\n"
        "steps: %d\nlinks: {rate_mbit: %g, pace_mbit: %g, codec_device: %s}\ncheckpoint: {replicate: none}\n",
        c, rate, model, stages, f.precision, f.micro_batches, f.micro_batch_size, schedule, c, BackwardFor(c, backward),
        f.steps, inproc_rate, SweepPaceMbit(tc, f.pace, rate), f.codec_device);
    // tc: every worker host's link sampled while the job runs; its idle time is profiled in the
    // steps tokens/s counts (after the first) but the last, whose end the coordinator hears of only
    // after the final checkpoint's write (which tokens/s leaves out). Step ends are seen by polling
    // the coordinator (within about 50 ms).
    std::unique_ptr<LinkSampler> sampler;
    if (tc && rate > 0 && f.steps >= 3) {
      std::vector<LinkSampler::Host> hosts;
      for (int i = 0; i < stages; ++i) {
        const std::string w = absl::StrCat("w", i);
        hosts.push_back({w, cl.worker(w)->pid()});
      }
      absl::StatusOr<std::unique_ptr<LinkSampler>> ls = LinkSampler::Start(std::move(hosts), absl::Milliseconds(5));
      if (!ls.ok()) return ls.status();
      sampler = std::move(*ls);
    }
    absl::StatusOr<uint64_t> job = cl.Submit(yaml);
    if (!job.ok()) return job.status();
    // The ends of steps 1..N-1 while the job runs, as polling sees them (each wait up to 10 minutes).
    std::vector<StepEnd> step_ends;
    bool still_running = true;
    for (int64_t k = 1; sampler && k <= f.steps - 1;) {
      absl::StatusOr<v1::JobStatus> seen = cl.WaitForStep(*job, k, absl::Minutes(10));
      if (!seen.ok()) return seen.status();
      still_running = seen->state() == v1::JOB_STATE_RUNNING && seen->step() <= f.steps - 1;
      if (!still_running) break;
      step_ends.push_back({seen->step(), absl::Now()});
      k = seen->step() + 1;
    }
    const StepWindow window = WindowOf(step_ends, still_running);
    absl::StatusOr<v1::JobStatus> st = cl.WaitForEnd(*job, absl::Minutes(10));
    if (!st.ok()) return st.status();
    // The hosts named with their stages ("w3 (stage 1)"), from the job's final status; the trace is
    // written whatever the job's outcome (a failed cell's is the one to look at), and one that
    // cannot be written costs the trace, not the cell.
    std::vector<std::string> names;
    if (sampler) {
      sampler->Stop();
      names = sampler->names();
      for (int s = 0; s < st->stages_size(); ++s) {
        for (std::string& n : names) {
          if (n == st->stages(s).worker_name()) n = absl::StrCat(n, " (stage ", s, ")");
        }
      }
      if (!f.link_trace.empty()) {
        if (absl::Status s = AppendLinkTrace(f.link_trace, absl::StrCat(rate, " ", c), round, names, sampler->up(),
                                             sampler->down(), step_ends);
            !s.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s\n", std::string(s.message()).c_str());
        }
      }
    }
    if (st->state() != v1::JOB_STATE_SUCCEEDED) return absl::InternalError(st->error());
    // The job's checkpoints are not needed (a gpt2-xl stage writes gigabytes): free the disk.
    // (common/list_dir.h, not std::filesystem, which breaks in binaries that link the PyTorch wheel.)
    absl::StatusOr<std::vector<common::DirEntry>> entries = common::ListDirectory(cl.dir());
    if (!entries.ok()) return entries.status();
    for (const common::DirEntry& e : *entries) {
      if (e.kind != common::DirEntry::kDirectory) continue;
      if (absl::Status s = common::RemoveTree(absl::StrCat(e.path, "/jobs/", *job)); !s.ok()) return s;
    }
    Sample sample;
    sample.tokens_per_s = st->tokens_per_s();
    if (tc && rate > 0) {
      absl::StatusOr<std::vector<netem::HostCounters>> counters = net->Counters();
      if (!counters.ok()) return counters.status();
      for (const netem::HostCounters& h : *counters) {
        sample.busiest_link_bytes = std::max<double>({sample.busiest_link_bytes, static_cast<double>(h.up.bytes),
                                                      static_cast<double>(h.down.bytes)});
        sample.drops += static_cast<double>(h.up.drops + h.down.drops);
      }
    }
    if (sampler && window.steps > 0) {
      const double bytes_per_s = rate * 1e6 / 8;
      const double frame_s = static_cast<double>(std::max(frame[c].first, frame[c].second)) / bytes_per_s;
      sample.idle = SharesOf(BusiestLinkIdle(names, sampler->up(), sampler->down(), window.begin, window.end,
                                             bytes_per_s, frame_s, TurnFrames(stages)),
                             window.steps);
    }
    return sample;
  };

  // Every cell is measured --repeats times and the unshaped ones (rate 0) unshaped_rounds times,
  // the rounds interleaved so that slow drift of this shared machine spreads over all cells;
  // medians reported.
  std::vector<double> all_rates = {0};
  all_rates.insert(all_rates.end(), rates.begin(), rates.end());
  std::map<std::pair<double, std::string>, std::vector<Sample>> samples;  // (rate, codec) -> jobs
  std::map<double, std::vector<double>> goodput;                           // rate -> TCP Mbit/s (tc)
  auto where = [](double rate) { return rate > 0 ? absl::StrCat(rate, " Mbit/s") : std::string("unshaped"); };
  for (int64_t rep = 0; rep < unshaped_rounds; ++rep) {
    for (double rate : all_rates) {
      const int64_t rounds = rate > 0 ? f.repeats : unshaped_rounds;
      if (rep >= rounds) continue;
      if (tc && rate > 0) {
        // What TCP itself gets through one shaped link at this rate (about 2 s of traffic).
        if (absl::Status s = net->SetRate(rate); !s.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s\n", std::string(s.message()).c_str());
          return 1;
        }
        const int64_t probe = std::max<int64_t>(256 << 10, static_cast<int64_t>(rate * 1e6 / 8 * 2));
        absl::StatusOr<double> g = net->TcpGoodputTo("w1", probe);
        if (!g.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: TCP probe at %g Mbit/s: %s\n", rate,
                       std::string(g.status().message()).c_str());
          return 1;
        }
        goodput[rate].push_back(*g);
      }
      for (const std::string& c : codecs) {
        if (!json) {
          std::fprintf(stderr, "round %lld/%lld: %s, %s...\n", static_cast<long long>(rep + 1),
                       static_cast<long long>(rounds), where(rate).c_str(), c.c_str());
        }
        absl::StatusOr<Sample> t = run(c, rate, rep + 1);
        if (!t.ok()) {
          std::fprintf(stderr, "longhaul-bench sweep: %s at %s: %s\n", c.c_str(), where(rate).c_str(),
                       std::string(t.status().message()).c_str());
          return 1;
        }
        samples[{rate, c}].push_back(*t);
        if (!json) {  // each cell as it ends, so that a run cut short still shows what it measured
          std::string idle;
          if (const IdleShares& i = t->idle; !i.link.empty()) {
            idle = absl::StrFormat(
                "; steps 2-%d: %s busy %.2f, idle between frames %.2f, in turns %.2f (%.1f a step), in long gaps "
                "%.2f (%.1f a step)",
                f.steps - 1, i.link, i.busy, i.between_frames, i.turns, i.turns_per_step, i.long_gaps, i.long_per_step);
          }
          std::fprintf(stderr, "  %s, %s: %.0f tokens/s%s\n", where(rate).c_str(), c.c_str(), t->tokens_per_s,
                       tc && rate > 0 ? absl::StrFormat(" (busiest link %.0f KB, %.0f drops%s)",
                                                        t->busiest_link_bytes / 1e3, t->drops, idle).c_str()
                                      : "");
        }
      }
    }
  }
  auto median_of = [&](const std::vector<Sample>& v, double Sample::*field) {
    return MedianOf(v, [field](const Sample& s) { return s.*field; });
  };
  // The bytes per step that must cross the busiest link. GPipe runs all forwards, then all
  // backwards, so a link's two directions never overlap and a step needs forward + backward
  // time; so does 1F1B over tc, where a middle host's access link carries its forward output and
  // its backward output in the same direction. Only 1F1B over the in-process shaper (each directed
  // link has the rate to itself) is bounded by the larger of the two.
  const bool sum_directions = tc || schedule == "gpipe";
  std::vector<SweepRun> runs;
  for (double rate : rates) {
    for (const std::string& c : codecs) {
      const std::vector<Sample>& cell = samples[{rate, c}];
      SweepRun r{c, BackwardFor(c, backward), rate, median_of(cell, &Sample::tokens_per_s),
                 median_of(samples[{0, c}], &Sample::tokens_per_s)};
      r.wire_bytes_per_step = median_of(cell, &Sample::busiest_link_bytes) / static_cast<double>(f.steps);
      r.drops = median_of(cell, &Sample::drops);
      auto idle_median = [&](double IdleShares::*field) {
        return MedianOf(cell, [field](const Sample& s) { return s.idle.*field; });
      };
      r.idle = {cell.back().idle.link,
                idle_median(&IdleShares::busy),
                idle_median(&IdleShares::between_frames),
                idle_median(&IdleShares::turns),
                idle_median(&IdleShares::long_gaps),
                idle_median(&IdleShares::turns_per_step),
                idle_median(&IdleShares::long_per_step)};
      r.goodput_mbit = tc ? Median(goodput[rate]) : rate;
      const LinkBounds lb = ComputeLinkBounds({tokens_per_step, frame[c].first, frame[c].second, f.micro_batches,
                                               stages, sum_directions, schedule == "gpipe", rate, r.goodput_mbit});
      r.frame_bytes_per_step = lb.busiest_bytes;
      r.link_bound = lb.at_rate;
      r.goodput_link_bound = lb.at_goodput;
      r.fraction = r.tokens_per_s / std::min(r.compute_bound, r.link_bound);
      r.goodput_fraction = r.tokens_per_s / std::min(r.compute_bound, r.goodput_link_bound);
      if (schedule == "gpipe") {
        r.gpipe_link_bound = lb.gpipe_at_rate;
        r.gpipe_fraction = r.tokens_per_s / std::min(r.compute_bound, r.gpipe_link_bound);
        r.gpipe_goodput_bound = lb.gpipe_at_goodput;
        r.gpipe_goodput_fraction = r.tokens_per_s / std::min(r.compute_bound, r.gpipe_goodput_bound);
      }
      runs.push_back(r);
    }
  }

  const ReportSettings report{tc, f.pace, f.steps, stages, tokens_per_step, unshaped_rounds};
  const std::string md = SweepMarkdown(runs, report);
  if (json) {
    std::printf("%s\n", SweepJson(runs, report).dump(2).c_str());
  } else {
    std::printf("%s", md.c_str());
  }
  if (!f.markdown.empty()) {
    std::ofstream(f.markdown) << md;
  }
  if (!f.svg.empty()) {
    std::vector<PlotSeries> series;
    for (const std::string& c : codecs) series.push_back({c, absl::StrCat(c, " / ", BackwardFor(c, backward))});
    std::vector<PlotPoint> points;
    for (const SweepRun& r : runs) points.push_back({r.codec, r.rate, r.tokens_per_s});
    std::ofstream(f.svg) << ThroughputSvg(series, rates, points);
  }
  return 0;
}

}  // namespace

BenchmarkRun AddSweepBench(CLI::App& app) {
  auto f = std::make_shared<SweepFlags>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "a local cluster trained at several link rates and codecs (throughput table)");
  cmd->add_option("--rates", f->rates, "link rates in Mbit/s, comma-separated")
      ->type_name("R,...")
      ->delimiter(',')
      ->default_str("2,10,100");
  cmd->add_option("--codecs", f->codecs, "forward codecs, comma-separated")
      ->type_name("C,...")
      ->delimiter(',')
      ->default_str("fp32,fp16,int4,tahquant");
  cmd->add_option("--backward", f->backward, "backward codec, or auto (see below)")->type_name("auto|SPEC");
  cmd->add_option("--steps", f->steps, "training steps per job")->type_name("N");
  cmd->add_option("--layers", f->layers, "transformer layers")->type_name("N");
  cmd->add_option("--stages", f->stages, "pipeline stages, one worker process each (default: one per layer)")
      ->type_name("N");
  cmd->add_option("--preset", f->preset, "GPT-2 sizes (hidden, heads, vocab) from a preset; --layers and --context still apply")
      ->type_name("gpt2-small|gpt2-medium|gpt2-large|gpt2-xl");
  cmd->add_option("--device", f->devices,
                  "the workers' devices, dealt to them in turn (one: every worker shares it; "
                  "cuda:0,cuda:1,...: one GPU each)")
      ->type_name("cpu|cuda:N,...")
      ->delimiter(',')
      ->default_str("cpu");
  cmd->add_option("--precision", f->precision, "the stages' precision")->type_name("fp32|bf16");
  cmd->add_option("--codec-device", f->codec_device, "where CUDA stages run the links' codecs")->type_name("auto|cpu|gpu");
  cmd->add_option("--hidden", f->hidden, "hidden size")->type_name("N");
  cmd->add_option("--context", f->context, "context length (tokens)")->type_name("N");
  cmd->add_option("--micro-batches", f->micro_batches, "micro-batches per step")->type_name("N");
  cmd->add_option("--micro-batch-size", f->micro_batch_size, "sequences per micro-batch")->type_name("N");
  cmd->add_option("--schedule", f->schedule, "pipeline schedule")->type_name("gpipe|1f1b");
  cmd->add_option("--repeats", f->repeats, "jobs per cell, in interleaved rounds (median reported)")->type_name("N");
  cmd->add_option("--unshaped-repeats", f->unshaped_repeats,
                  "jobs per unshaped cell, whose median is the compute bound (fewer than --repeats: --repeats)")
      ->type_name("N");
  cmd->add_option("--shaper", f->shaper, "auto: tc as root, else inprocess")->type_name("auto|tc|inprocess");
  cmd->add_flag("--tc", f->tc, "the same as --shaper=tc");
  cmd->add_option("--pace", f->pace,
                  "tc: the workers pace each link they send on (the job's links.pace_mbit) at this fraction of the "
                  "TCP payload the rate carries (rate x 1448 / 1514); 0: unpaced")
      ->type_name("FRACTION")
      ->capture_default_str();
  cmd->add_option("--queue-ms", f->queue_ms, "tc: each direction's tbf queue, in ms of traffic at the rate, 1..60000")
      ->type_name("N");
  cmd->add_option("--tcp-congestion", f->tcp_congestion,
                  absl::StrCat("tc: the hosts' TCP congestion control, or ", netem::kMachineCongestion,
                               " for this machine's (docs/netem-sweep.md)"))
      ->type_name("NAME");
  cmd->add_option("--markdown", f->markdown, "also write the table here")->type_name("PATH");
  cmd->add_option("--svg", f->svg, "also plot tokens/s against the rate here")->type_name("PATH");
  cmd->add_option("--link-trace", f->link_trace,
                  "tc, --steps >= 3: also write every job's link samples (each host's cumulative eth0 bytes "
                  "every 5 ms) and the steps it was seen to end (polled), as CSV")
      ->type_name("PATH");
  cmd->add_flag("--json", f->json, "{\"runs\": [...]}, one object per (rate, codec), instead of the table");
  cmd->add_flag("--data-parallel", f->data_parallel,
                "the data-parallel cells instead: replicated stages in this process, links between regions "
                "at --rates (default 10,100), per --dp-codecs");
  cmd->add_option("--dp-codecs", f->dp_codecs, "--data-parallel: the replicas' sync codecs, comma-separated")
      ->type_name("C,...")
      ->delimiter(',')
      ->default_str("fp32,sdp4bit,bitdp2");
  cmd->add_option("--dp-replicas", f->dp_replicas, "--data-parallel: replicas of every stage, or of each")
      ->type_name("N|N0,N1,...")
      ->delimiter(',')
      ->default_str("4");
  cmd->add_option("--dp-regions", f->dp_regions, "--data-parallel: regions the replicas are dealt to in turn")
      ->type_name("N");
  cmd->add_flag("--processes", f->processes,
                "--data-parallel: the cells as jobs of worker processes over gRPC (a coordinator and a "
                "longhaul-worker per replica, --region dealt in turn; --stages default 1; tokens/s and the "
                "last step's sync from the coordinator) instead of replicas in this process");
  cmd->footer(absl::StrCat(
      "Trains the same job (GPT, one layer per worker process) at every link rate with every forward\n"
      "codec, plus unshaped per codec (the compute bound), each cell --repeats times (the unshaped\n"
      "ones --unshaped-repeats, if more) in interleaved rounds, and prints the median tokens/s, the\n"
      "compute and link bounds, throughput / min(bounds)\n"
      "and the speed-up over fp32 at the same rate. Raw forward links (fp32/fp16/bf16) keep raw\n"
      "backward links; quantised ones use --backward (auto: int4; the paper compresses gradients as\n"
      "well). Many small micro-batches: a step's pipeline fill and drain cost\n"
      "(stages - 1) / (micro-batches + stages - 1).\n"
      "--shaper=tc (root): the coordinator and workers run in network namespaces (longhaul-netem's\n"
      "network lhsw, 10.79.0.0/24: one tc sweep at a time; a second waits up to ", ClaimPatienceText(),
      " for the\n"
      "first to remove it, then gives up naming its pid) and every host's access link is shaped with\n"
      "tc tbf in both directions, each queueing up to --queue-ms of traffic (with longhaul-netem's\n"
      "default of 400, BBR's probes above the rate overflowed the queue: at 2 Mbit/s 18% of an int4\n"
      "run's bytes were retransmissions; cubic hosts fill whatever queue there is).\n"
      "--shaper=inprocess: every data-plane link is shaped by the in-process token bucket.\n"
      "The link bound counts forward + backward bytes per step on the busiest link, except for 1f1b\n"
      "in-process (each direction has its own bucket): the larger.\n"
      "In tc mode each rate also gets a TCP probe through one shaped link (the goodput TCP itself\n"
      "reaches after its headers), and the table shows the simple link bound at that goodput and the\n"
      "throughput against both bounds at it (the simple one and GPipe's, with its fill and drain;\n"
      "--json has GPipe's value too), the bytes per step the busiest link\n"
      "direction carried according to its qdisc (frames plus every header, ACK and window update)\n"
      "next to the frame bytes the bounds count, packets dropped, and how busy that link was (its\n"
      "bytes at the rate / step time). The hosts' TCP congestion control is --tcp-congestion's,\n"
      "whatever this machine's default is (BBR under-fills tbf-shaped links whose ACKs share them).\n"
      "--pace has the workers pace what they send on each link just under what the link carries\n"
      "(rate x 1448 / 1514, the TCP payload of full frames): unpaced, a stage forwarding frames while\n"
      "its own download is full sends slower than its link's rate (docs/netem-sweep.md, \"Paced\n"
      "senders\").\n"
      "With --steps of 3 or more, a second table (tc; --json: \"idle\") says where the busiest link\n"
      "direction was idle in steps 2..N-1 (the last one's end is seen only after the final checkpoint\n"
      "is written): each worker host's eth0 counters sampled every 5 ms, the idle time split into gaps\n"
      "shorter than one frame's time at the rate (each frame's latency), gaps of 1-8 frame times\n"
      "(2 (S - 1) for S > 5 stages: GPipe's fill, drain and turn between the passes) and longer ones\n"
      "(step boundaries, stalls).\n"
      "--data-parallel: --dp-replicas replicas of every stage (default 4 = 2 regions x 2; a list: per\n"
      "stage) train in this process (the workers' ReplicaSync over in-process transports; default 2\n"
      "stages, 8 micro-batches of 4), replica r of a stage in region r % --dp-regions, every link\n"
      "between replicas of different regions shaped at each of --rates (default 10,100; within a region\n"
      "and along the pipeline unshaped), plus unshaped. Per cell: the step time and its bound, the\n"
      "largest over the stages of (the unshaped step minus the stage's slowest unshaped sync) + (the\n"
      "larger of that sync and the most bytes one of its replicas sends to one replica of another\n"
      "region / rate: each such directed link is shaped on its own), and over every replica of\n"
      "(its unshaped sync's start) + (the larger of its unshaped sync and its own busiest link's bytes /\n"
      "rate), and, where its sync calls an update (sdp4bit, zeropp: between the reduce-scatter and the\n"
      "weights' all-gather; bitdp: after its all-gather), its chain: (its start) + (the larger of its\n"
      "unshaped time before the update and its busiest link's bytes before it / rate) + (the same after\n"
      "the update); bound / measured (in brackets without the chains), the bounding stage's or\n"
      "replica's sync against its bound, the slowest replica's sync of any stage, and the speed-ups\n"
      "over fp32. Flags of the pipeline cells (--codecs, --device, --shaper, ...) are refused.\n"
      "--data-parallel --processes: the same cells as jobs of worker processes over gRPC: a\n"
      "coordinator and one longhaul-worker per replica (--stages default 1, so that every byte between\n"
      "regions is the replicas'; --dp-regions at least 2), the links between regions shaped by the\n"
      "workers (links.between_regions_mbit). Per cell the coordinator's tokens/s and the latest step's\n"
      "slowest sync; bound: the unshaped step minus its sync plus the larger of that sync and the\n"
      "busiest link's bytes (any replica's) / rate, or the same for a replica from its own figures\n"
      "(longhaulctl status's per-replica sync), its chain included."));
  return [f, cmd] { return RunSweep(*f, *cmd); };
}

}  // namespace longhaul::bench
