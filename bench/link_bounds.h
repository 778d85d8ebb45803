// The link bounds of the throughput sweep's cells (sweep_bench.cc): tokens per second that no
// pipeline step over links at a rate can beat, however fast its stages. Header-only (tested in
// tests/bench/link_bounds_test.cc).
#ifndef LONGHAUL_BENCH_LINK_BOUNDS_H_
#define LONGHAUL_BENCH_LINK_BOUNDS_H_

#include <algorithm>
#include <cstdint>

namespace longhaul::bench {

// A GPipe step over links at one rate takes at least (M + S - 2) x (forward frame time + backward
// frame time), M micro-batches, S >= 2 stages, against M x (both) on the busiest link alone: with
// no compute at all, stage 1 (the busiest's host, tc) sends its first backward frame only after
// stage S - 1 has received all M forward frames, the last no earlier than S - 2 + M forward frame
// times from the start (stage S - 2's link sends them one after another, the first after S - 2
// hops), and the gradient has come back S - 2 hops; then its M backward frames go one after
// another. Each stage sends a micro-batch's output only once it has received all of its input.
// The same holds with a rate per directed link (in-process). Returns M + S - 2 (M for S < 2).
inline double GPipeLinkSteps(int64_t micro_batches, int stages) {
  return static_cast<double>(micro_batches + std::max(0, stages - 2));
}

struct LinkBoundInputs {
  double tokens_per_step = 0;
  int64_t forward_frame_bytes = 0, backward_frame_bytes = 0;  // one micro-batch's
  int64_t micro_batches = 0;
  int stages = 0;
  // Whether the busiest link carries both directions' frames one after the other (GPipe; 1F1B
  // over tc, where a middle host's uplink carries its forward and its backward output), or only
  // the larger (1F1B with a rate per directed link, in-process).
  bool sum_directions = true;
  bool gpipe = true;
  double rate_mbit = 0;     // the configured rate
  double goodput_mbit = 0;  // what one TCP connection reached through the shaped link (tc), or the rate
};

struct LinkBounds {
  double busiest_bytes = 0;  // frame bytes per step on the busiest link
  double at_rate = 0, at_goodput = 0;
  // GPipe only (0 otherwise): with the schedule's fill and drain (GPipeLinkSteps).
  double gpipe_at_rate = 0, gpipe_at_goodput = 0;
};

inline LinkBounds ComputeLinkBounds(const LinkBoundInputs& in) {
  LinkBounds b;
  const double f = static_cast<double>(in.forward_frame_bytes), w = static_cast<double>(in.backward_frame_bytes);
  b.busiest_bytes = (in.sum_directions ? f + w : std::max(f, w)) * static_cast<double>(in.micro_batches);
  const double rate = in.rate_mbit * 1e6 / 8, goodput = in.goodput_mbit * 1e6 / 8;  // bytes per second
  b.at_rate = in.tokens_per_step / (b.busiest_bytes / rate);
  b.at_goodput = in.tokens_per_step / (b.busiest_bytes / goodput);
  if (in.gpipe) {
    const double frames = GPipeLinkSteps(in.micro_batches, in.stages) * (f + w);
    b.gpipe_at_rate = in.tokens_per_step / (frames / rate);
    b.gpipe_at_goodput = in.tokens_per_step / (frames / goodput);
  }
  return b;
}

// A data-parallel sync's own bounds (dp_sweep_bench.cc), from its unshaped figures (seconds) and
// its busiest link's bytes between regions at `bytes_per_s`.
struct SyncFigures {
  double sync = 0;                 // the sync call's wall time, unshaped
  double before_update = -1;       // from its start to its update's (-1: it has no update)
  double after_update = 0;         // from its update's end to its own
  int64_t link_bytes = 0;          // on its busiest link between regions
  int64_t link_bytes_before_update = 0, link_bytes_after_update = 0;  // the busiest before / after it
};

// The larger of its unshaped time and its busiest link's bytes at the rate.
inline double SyncBound(const SyncFigures& f, double bytes_per_s) {
  return std::max(f.sync, static_cast<double>(f.link_bytes) / bytes_per_s);
}

// Its chain (0 without an update): what it sends after its update cannot leave before the update
// has begun, nor the update begin before what it sends before it has gone, so each part takes at
// least the larger of its unshaped time and its own bytes at the rate. The update's own time is
// left out: it holds the clipping norm's wait for the other replicas and stages, which a shaped
// run may shorten. Never below the whole's link time (the busiest link's bytes are at most those
// before plus those after), which SyncBound lets pass under the unshaped time.
inline double SyncChainBound(const SyncFigures& f, double bytes_per_s) {
  if (f.before_update < 0) return 0;
  return std::max(f.before_update, static_cast<double>(f.link_bytes_before_update) / bytes_per_s) +
         std::max(f.after_update, static_cast<double>(f.link_bytes_after_update) / bytes_per_s);
}

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_LINK_BOUNDS_H_
