// When a shaped access link was idle during a sweep cell (sweep_bench.cc, tc only): LinkSampler
// reads, every few milliseconds, how many bytes each host's eth0 has sent and received (the
// network namespace's /proc/PID/net/dev, through a process inside it: no process spawned per
// sample), and ProfileIdle splits the idle time of one direction of one link inside a window (the
// steady-state steps) by the length of its gaps, in frame times: gaps shorter than a frame
// (between frames: each frame's latency), up to kTurnFrames frames (GPipe's fill, drain and the
// turn from the forward to the backward phase: 2 (S - 2) frame times a step in its bound), and
// longer (step boundaries, stalls).
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
#include <vector>

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

// Gaps longer than one frame and up to this many frames are GPipe's turns (see the top).
inline constexpr double kTurnFrames = 8;

struct IdleProfile {
  double window_s = 0;
  double busy_s = 0;  // bytes in the window at the rate
  // Idle seconds by gap length (a gap: consecutive intervals each under half its bytes at the
  // rate; the partial idleness of the other intervals counts as between frames).
  double between_frames_s = 0, turns_s = 0, long_s = 0;
  int turns = 0, long_gaps = 0;  // gaps of those two kinds
};
// The idle time of `s` within [begin, end) at `rate_bytes_per_s`, gaps measured in frames of
// `frame_s` seconds. Intervals that straddle the window count in proportion.
IdleProfile ProfileIdle(const ByteSeries& s, absl::Time begin, absl::Time end, double rate_bytes_per_s,
                        double frame_s);

// The direction of a host's link that carried the most bytes within [begin, end) ("w1 up": the
// host's transmit side; "down": what it received), and its idle profile at the rate.
struct LinkIdle {
  std::string link;
  IdleProfile idle;
};
class LinkSampler;
LinkIdle BusiestLinkIdle(const LinkSampler& s, absl::Time begin, absl::Time end, double rate_bytes_per_s,
                         double frame_s);

// Samples eth0's counters of every host (a pid inside its namespace) every `period`.
class LinkSampler {
 public:
  struct Host {
    std::string name;
    pid_t pid = 0;
  };
  // Fails (naming the host) when a host's counters cannot be read at the start.
  static absl::StatusOr<std::unique_ptr<LinkSampler>> Start(std::vector<Host> hosts, absl::Duration period);
  ~LinkSampler();  // stops
  // Stops sampling; the series of every host's transmit (up) and receive (down) side, in the
  // order of `hosts`. A read that fails later (the process ended) ends that host's series.
  void Stop();
  const std::vector<Host>& hosts() const { return hosts_; }
  const std::vector<ByteSeries>& up() const { return up_; }
  const std::vector<ByteSeries>& down() const { return down_; }

 private:
  LinkSampler(std::vector<Host> hosts, absl::Duration period);
  void Loop();
  std::vector<Host> hosts_;
  const absl::Duration period_;
  std::vector<ByteSeries> up_, down_;  // written by the sampling thread until Stop joins it
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_LINK_TIMELINE_H_
