#include "bench/sweep_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "netem/tc/network.h"

namespace longhaul::bench {
namespace {

// The fp32 cell's tokens/s at `rate` (0 when there is none).
double Fp32At(const std::vector<SweepRun>& runs, double rate) {
  for (const SweepRun& r : runs) {
    if (r.rate == rate && r.codec == "fp32") return r.tokens_per_s;
  }
  return 0.0;
}

// The share of each step the busiest link spent transmitting what the qdisc counted (tc).
double LinkBusy(const SweepRun& r, const ReportSettings& s) {
  return r.wire_bytes_per_step / (r.rate * 1e6 / 8) / (s.tokens_per_step / r.tokens_per_s);
}

}  // namespace

double SweepPaceMbit(bool tc, double pace, double rate) {
  return tc && rate > 0 ? pace * netem::TcpPayloadMbit(rate) : 0.0;
}

std::string SweepMarkdown(const std::vector<SweepRun>& runs, const ReportSettings& s) {
  const bool tc = s.tc;
  std::string md = absl::StrFormat(
      "| link Mbit/s | forward / backward | tokens/s | compute bound | link bound at the rate | "
      "TCP goodput Mbit/s | link bound at the goodput | tokens/s / min(compute, rate bound) | "
      "tokens/s / min(compute, goodput bound) | GPipe link bound at the rate (fill and drain) | "
      "tokens/s / min(compute, GPipe bound) | tokens/s / min(compute, GPipe bound at the goodput) | "
      "busiest link KB/step: frames / on the wire | drops | link busy | speed-up vs fp32 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SweepRun& r : runs) {
    const double base = Fp32At(runs, r.rate);
    const bool gpipe = r.gpipe_link_bound > 0;
    absl::StrAppendFormat(&md, "| %g | %s / %s | %.0f | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s |\n",
                          r.rate, r.codec, r.backward, r.tokens_per_s, r.compute_bound, r.link_bound, r.goodput_mbit,
                          r.goodput_link_bound, r.fraction, r.goodput_fraction,
                          gpipe ? absl::StrFormat("%.0f", r.gpipe_link_bound) : "-",
                          gpipe ? absl::StrFormat("%.2f", r.gpipe_fraction) : "-",
                          gpipe ? absl::StrFormat("%.2f", r.gpipe_goodput_fraction) : "-",
                          tc ? absl::StrFormat("%.0f / %.0f", r.frame_bytes_per_step / 1e3, r.wire_bytes_per_step / 1e3)
                             : absl::StrFormat("%.0f / -", r.frame_bytes_per_step / 1e3),
                          tc ? absl::StrFormat("%.0f", r.drops) : "-", tc ? absl::StrFormat("%.2f", LinkBusy(r, s)) : "-",
                          base > 0 ? absl::StrFormat("%.2fx", r.tokens_per_s / base) : "-");
  }
  absl::StrAppendFormat(&md, "\nCompute bound: the median of %d unshaped job%s per codec.\n", s.unshaped_rounds,
                        s.unshaped_rounds == 1 ? "" : "s");
  if (tc) {
    absl::StrAppend(&md, s.pace > 0 ? absl::StrFormat("\nSenders paced at %g of the TCP payload the rate carries "
                                                      "(links.pace_mbit).\n",
                                                      s.pace)
                                    : std::string("\nSenders unpaced.\n"));
  }
  // tc: where the busiest link was idle (LinkSampler), a table of its own.
  if (tc && s.steps >= 3) {
    absl::StrAppendFormat(&md,
                          "\nWhere the busiest link was idle in steps 2-%d (its bytes sampled every 5 ms; gaps in "
                          "frame times: shorter than one, up to %g, longer; the link: the last round's):\n\n"
                          "| link Mbit/s | forward / backward | link | busy | idle between frames | idle in turns | "
                          "turns a step | idle in long gaps | long gaps a step |\n|---|---|---|---|---|---|---|---|---|\n",
                          s.steps - 1, TurnFrames(s.stages));
    for (const SweepRun& r : runs) {
      const IdleShares& i = r.idle;
      absl::StrAppendFormat(&md, "| %g | %s / %s | %s | %.2f | %.2f | %.2f | %.1f | %.2f | %.1f |\n", r.rate, r.codec,
                            r.backward, i.link, i.busy, i.between_frames, i.turns, i.turns_per_step, i.long_gaps,
                            i.long_per_step);
    }
  }
  return md;
}

nlohmann::ordered_json SweepJson(const std::vector<SweepRun>& runs, const ReportSettings& s) {
  // null where the link was not sampled (in-process shaper, fewer than 3 steps)
  auto idle_json = [](const IdleShares& i) {
    if (i.link.empty()) return nlohmann::ordered_json(nullptr);
    return nlohmann::ordered_json{{"link", i.link},
                                  {"busy", Round(i.busy, 3)},
                                  {"between_frames", Round(i.between_frames, 3)},
                                  {"turns", Round(i.turns, 3)},
                                  {"turns_per_step", Round(i.turns_per_step, 2)},
                                  {"long_gaps", Round(i.long_gaps, 3)},
                                  {"long_gaps_per_step", Round(i.long_per_step, 2)}};
  };
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const SweepRun& r : runs) {
    // The GPipe columns: null where the schedule is not GPipe.
    auto gpipe = [&r](double v, int digits) {
      return r.gpipe_link_bound > 0 ? nlohmann::ordered_json(Round(v, digits)) : nlohmann::ordered_json(nullptr);
    };
    rows.push_back({
        {"rate_mbit", r.rate},
        {"forward", r.codec},
        {"backward", r.backward},
        {"tokens_per_s", Round(r.tokens_per_s, 1)},
        {"compute_bound", Round(r.compute_bound, 1)},
        {"compute_bound_jobs", s.unshaped_rounds},
        {"link_bound", Round(r.link_bound, 1)},
        {"tcp_goodput_mbit", Round(r.goodput_mbit, 3)},
        {"pace_mbit", Round(SweepPaceMbit(s.tc, s.pace, r.rate), 3)},
        {"goodput_link_bound", Round(r.goodput_link_bound, 1)},
        {"fraction_of_bound", Round(r.fraction, 3)},
        {"fraction_of_goodput_bound", Round(r.goodput_fraction, 3)},
        {"gpipe_link_bound", gpipe(r.gpipe_link_bound, 1)},
        {"fraction_of_gpipe_bound", gpipe(r.gpipe_fraction, 3)},
        {"gpipe_goodput_bound", gpipe(r.gpipe_goodput_bound, 1)},
        {"fraction_of_gpipe_goodput_bound", gpipe(r.gpipe_goodput_fraction, 3)},
        {"frame_bytes_per_step", Round(r.frame_bytes_per_step, 0)},
        {"wire_bytes_per_step", Round(r.wire_bytes_per_step, 0)},
        {"drops", Round(r.drops, 0)},
        {"link_busy", Round(s.tc ? LinkBusy(r, s) : 0.0, 3)},
        {"idle", idle_json(r.idle)},
        {"speedup_vs_fp32", Round(Fp32At(runs, r.rate) > 0 ? r.tokens_per_s / Fp32At(runs, r.rate) : 0.0, 3)},
    });
  }
  return nlohmann::ordered_json{{"runs", rows}};
}

}  // namespace longhaul::bench
