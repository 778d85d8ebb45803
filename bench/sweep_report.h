// The throughput sweep's report (sweep_bench.cc): each cell's figures as its markdown tables and
// its --json, and the senders' pace, decided here for both the jobs and the report.
#ifndef LONGHAUL_BENCH_SWEEP_REPORT_H_
#define LONGHAUL_BENCH_SWEEP_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/link_timeline.h"

namespace longhaul::bench {

// One cell (rate, codec): the medians of its jobs and its bounds.
struct SweepRun {
  std::string codec, backward;
  double rate = 0;  // Mbit/s, 0 = unshaped
  double tokens_per_s = 0;
  double compute_bound = 0;
  double link_bound = 0;          // at the configured rate
  double goodput_link_bound = 0;  // at the TCP goodput measured on the shaped link (tc); = link_bound in-process
  double goodput_mbit = 0;
  // tc only: what the busiest access-link direction actually carried per step (qdisc counters:
  // frames plus chunk/gRPC/HTTP2/TCP/IP headers, ACKs and window updates of the other direction's
  // traffic, the control plane), and packets the qdiscs dropped in the whole job. 0 in-process.
  double wire_bytes_per_step = 0;
  double drops = 0;
  double frame_bytes_per_step = 0;  // what the link bound counts on the busiest link
  double fraction = 0;              // tokens/s / min(compute, link bound at the rate)
  double goodput_fraction = 0;      // tokens/s / min(compute, link bound at the goodput)
  // GPipe only (0 otherwise): the link bound with the schedule's fill and drain (GPipeLinkSteps),
  // at the rate and at the TCP goodput, and tokens/s / min(compute, each).
  double gpipe_link_bound = 0;
  double gpipe_fraction = 0;
  double gpipe_goodput_bound = 0;
  double gpipe_goodput_fraction = 0;
  IdleShares idle = {};  // tc: the medians of Sample::idle's (link_timeline.h)
};

struct ReportSettings {
  bool tc = false;     // tc-shaped hosts (qdisc counters, the pace, the idle table)
  double pace = 0;     // --pace
  int64_t steps = 0;   // training steps per job
  int stages = 0;
  double tokens_per_step = 0;
  int64_t unshaped_rounds = 1;  // jobs per unshaped cell: the compute bound is their median
};

// tc: the pace (Mbit/s of TCP payload, links.pace_mbit) of every job's senders at `rate`: `pace` of
// what the rate carries (netem::TcpPayloadMbit); 0 unpaced, and for unshaped cells.
double SweepPaceMbit(bool tc, double pace, double rate);

// The throughput table, the pace (tc) and the idle table (tc, 3 steps or more), in markdown.
std::string SweepMarkdown(const std::vector<SweepRun>& runs, const ReportSettings& s);
// {"runs": [...]}, one object per cell.
nlohmann::ordered_json SweepJson(const std::vector<SweepRun>& runs, const ReportSettings& s);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_SWEEP_REPORT_H_
