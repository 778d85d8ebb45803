// When a shaped access link was idle during a sweep cell (sweep_bench.cc, tc only): LinkSampler
// reads, every few milliseconds, how many bytes each host's eth0 has sent and received (the
// network namespace's /proc/PID/net/dev, through a process inside it: no process spawned per
// sample), and ProfileIdle splits the idle time of one direction of one link inside a window (whole
// training steps) by the length of its gaps, in frame times: gaps shorter than a frame (between
// frames: each frame's latency), up to `turn_frames` frames (GPipe's fill, drain and the turn from
// the forward to the backward pass: 2 (S - 2) frame times a step in its bound), and longer (step
// boundaries, stalls).
//
// Threading: LinkSampler's methods from one thread; it samples on a thread of its own.
#ifndef LONGHAUL_BENCH_LINK_TIMELINE_H_
#define LONGHAUL_BENCH_LINK_TIMELINE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace longhaul::bench {

struct DevBytes {
  int64_t rx = 0, tx = 0;
};
// The byte counters of `dev` in a /proc/net/dev text (two header lines, then "dev: rx_bytes
// rx_packets ... (8 receive fields) tx_bytes ..."); an error naming the device when it is absent
// or its line is malformed.
absl::StatusOr<DevBytes> ParseNetDev(absl::string_view text, absl::string_view dev);

// One direction of one link over time: cumulative bytes at each sample time.
struct ByteSeries {
  std::vector<absl::Time> at;
  std::vector<int64_t> bytes;
};

// GPipe's turns on S stages are up to about 2 (S - 2) frame times; gaps up to this many frames
// count as turns (at least 8).
inline double TurnFrames(int stages) { return stages > 5 ? 2.0 * (stages - 2) + 2 : 8.0; }

struct IdleProfile {
  double window_s = 0;
  double busy_s = 0;  // bytes in the window at the rate
  // Idle seconds in the window by the length of the gap they belong to (a gap: consecutive sample
  // intervals each under half its bytes at the rate, measured over the whole series, so a gap that
  // crosses the window's edge keeps its kind). The partial idleness of the other intervals counts
  // as between frames.
  double between_frames_s = 0, turns_s = 0, long_s = 0;
  int turns = 0, long_gaps = 0;  // gaps of those two kinds with idle time in the window
};
// The idle time of `s` within [begin, end) at `rate_bytes_per_s`, gaps measured in frames of
// `frame_s` seconds; gaps up to `turn_frames` frames are turns. Bytes above the rate in one
// interval (a sample taken late, a burst) carry over to the next. Intervals that straddle the
// window count in proportion. A rate or frame of 0 gives the window's length only.
IdleProfile ProfileIdle(const ByteSeries& s, absl::Time begin, absl::Time end, double rate_bytes_per_s,
                        double frame_s, double turn_frames);

// The direction of a host's link that carried the most bytes within [begin, end) ("w1 up": what
// the host sent; "down": what it received), and its idle profile. `names`, `up` and `down` in the
// same order (LinkSampler's).
struct LinkIdle {
  std::string link;
  IdleProfile idle;
};
LinkIdle BusiestLinkIdle(const std::vector<std::string>& names, const std::vector<ByteSeries>& up,
                         const std::vector<ByteSeries>& down, absl::Time begin, absl::Time end,
                         double rate_bytes_per_s, double frame_s, double turn_frames);

// A LinkIdle as shares of its window (busy and each kind of idle time), and its turns and long
// gaps per step of the window's `steps` (> 0); `link` empty: not sampled.
struct IdleShares {
  std::string link;
  double busy = 0, between_frames = 0, turns = 0, long_gaps = 0, turns_per_step = 0, long_per_step = 0;
};
IdleShares SharesOf(const LinkIdle& li, int64_t steps);

// Samples a device's counters in every host's namespace (a pid inside it) every `period`.
class LinkSampler {
 public:
  struct Host {
    std::string name;
    pid_t pid = 0;
    std::string dev = "eth0";
  };
  // Fails (naming the host) when a host's counters cannot be read at the start.
  static absl::StatusOr<std::unique_ptr<LinkSampler>> Start(std::vector<Host> hosts, absl::Duration period);
  ~LinkSampler();  // stops
  // Stops sampling (idempotent). A read that fails while sampling (the process ended) ends that
  // host's series.
  void Stop();
  // After Stop: every host's transmit (up) and receive (down) series, in the order of `hosts`.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<ByteSeries>& up() const { return up_; }
  const std::vector<ByteSeries>& down() const { return down_; }

 private:
  LinkSampler(std::vector<Host> hosts, absl::Duration period);
  void Loop();
  const std::vector<Host> hosts_;
  const std::vector<std::string> names_;
  const absl::Duration period_;
  std::vector<ByteSeries> up_, down_;  // written by the sampling thread until Stop joins it
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A step the job was seen to have completed while it ran, and when the bench's poll saw it (up to
// one poll late; polling may skip steps).
struct StepEnd {
  int64_t step = 0;
  absl::Time seen;
};
// The whole steps between the first and the last end seen, when the job still ran at the last
// (`still_running`) and there are two; otherwise none (steps 0, begin and end infinite).
struct StepWindow {
  absl::Time begin = absl::InfiniteFuture(), end = absl::InfiniteFuture();
  int64_t steps = 0;
};
StepWindow WindowOf(const std::vector<StepEnd>& ends, bool still_running);

// Appends one job's samples to the CSV file `path` (created with its header when absent): a row
// "cell,round,step,,STEP,UNIX_S,," for each step end seen, then
// "cell,round,link,HOST,,UNIX_S,UP_BYTES,DOWN_BYTES" for every sample of every host (`names`, `up`
// and `down` in LinkSampler's order; the bytes are the eth0 counters, cumulative). An error names
// the path and the cause.
absl::Status AppendLinkTrace(const std::string& path, const std::string& cell, int64_t round,
                             const std::vector<std::string>& names, const std::vector<ByteSeries>& up,
                             const std::vector<ByteSeries>& down, const std::vector<StepEnd>& ends);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_LINK_TIMELINE_H_
