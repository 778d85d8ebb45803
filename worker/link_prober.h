// Measures this worker's links to its peers for the coordinator's link matrix: RTT and throughput
// to each peer's probe sink (netem::TcpSink, Boost.Asio), reported one probe at a time. The
// coordinator says who the peers are (ProbePeers: when a session opens, when a worker registers or
// dies); each is probed as soon as it appears and then every `interval`.
//
//   LinkProber prober(settings, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { send it },
//                     [&] { return busy; });
//   prober.SetPeers({{.id = 2, .name = "w1", .address = "10.0.0.2:7601"}});
//   ...  prober.Stop();   // or the destructor
//
// Bounds (docs/placement.md):
//   - per probe: at most `max_probe_bytes` (the peers' sinks refuse more); the first probe of a peer
//     sends `min_probe_bytes`, later ones as much as lasts about `target` at the last measured
//     rate, so a slow WAN link is probed with little data and a fast one long enough to measure;
//     when the first probe was too short to mean much, a second, sized one follows at once;
//   - in total: a token bucket of `budget_bytes_per_hour` (full at start, so the first round of
//     probes goes out at once); a probe waits until the bucket holds its bytes;
//   - never while this worker runs a stage (`busy`): the probe would compete with the job's own
//     traffic and measure neither; probing resumes when it is idle.
// Throughput is bytes / (time to the sink's confirmation - RTT): the confirmation's trip back
// and the first byte's trip out are not transfer time.
//
// Mutual probes. Two workers probing each other at once (they learn of each other at the same
// moment) each measure a link that also carries the other's transfer: the pings' echoes and the
// confirmation queue behind it (273 ms of RTT and 3.0 Mbit/s read on a 2 Mbit/s link). So a
// worker's probe sink refuses a probe that comes from the host its own prober is probing right now
// (ProbingHost, the sink's busy hook), and a prober whose probe was refused retries after a random
// `busy_retry_min`..`busy_retry_max` (the random delay breaks the tie when both were refused),
// neither reporting the refusal nor charging it to the budget, for up to `busy_patience`; then it
// reports the refusal as a failure (a sink also refuses probes above its per-probe cap, and the
// answer does not say which). Each peer's next probe is due after `interval` plus up to a tenth
// more, at random, so that two workers' schedules for a pair drift apart.
//
// Threading: one thread of its own; SetPeers and Stop from any thread; `report` and `busy` are
// called on the prober's thread without its lock held.
#ifndef LONGHAUL_WORKER_LINK_PROBER_H_
#define LONGHAUL_WORKER_LINK_PROBER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "longhaul/v1/control_plane.pb.h"

namespace longhaul::worker {

struct ProbeSettings {
  int64_t max_probe_bytes = int64_t{16} << 20;
  int64_t min_probe_bytes = int64_t{256} << 10;
  absl::Duration target = absl::Milliseconds(500);
  int pings = 5;
  absl::Duration interval = absl::Minutes(10);
  int64_t budget_bytes_per_hour = int64_t{1} << 30;
  absl::Duration connect_patience = absl::Seconds(2);
  absl::Duration busy_retry_min = absl::Milliseconds(100);
  absl::Duration busy_retry_max = absl::Milliseconds(800);
  absl::Duration busy_patience = absl::Seconds(30);
};

class LinkProber {
 public:
  struct Peer {
    uint64_t id = 0;
    std::string name;
    std::string address;  // host:port of its probe sink
  };
  using Report = std::function<void(const Peer&, const v1::LinkReport&)>;

  LinkProber(const ProbeSettings& s, Report report, std::function<bool()> busy);
  ~LinkProber();
  LinkProber(const LinkProber&) = delete;
  LinkProber& operator=(const LinkProber&) = delete;

  // Replaces the peer list; a peer whose address changed is probed afresh.
  void SetPeers(const std::vector<Peer>& peers);
  void Stop();

  // Probe bytes sent so far (budget accounting, for tests and logs).
  int64_t bytes_sent();

  // The probe sink's busy hook: whether this prober is probing a peer at `ipv4` right now (from
  // just before it connects until its probe ends). The sink refuses a probe from that host.
  bool ProbingHost(const std::string& ipv4);
  // Probes refused by a peer's sink and retried (for tests and logs).
  int64_t refusals();

 private:
  struct State {
    Peer peer;
    absl::Time due = absl::InfinitePast();  // next probe
    double mbit = 0;                        // last measured rate (sizes the next probe)
    int failures = 0;
    absl::Time refused_since = absl::InfiniteFuture();  // first of the refusals in a row
  };
  void Loop();
  // Probes `peer` with `bytes`; fills *r (error or measurement) and returns the rate (0 on error),
  // with the probe's time to confirmation in *seconds.
  // *refused: the sink refused the probe (busy, or above its cap).
  double ProbeOnce(const std::string& ipv4, int port, int64_t bytes, v1::LinkReport* r, double* seconds,
                   bool* refused);

  const ProbeSettings s_;
  const Report report_;
  const std::function<bool()> busy_;
  absl::Mutex mu_;
  std::map<uint64_t, State> peers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by SetPeers (wakes the loop)
  double tokens_ ABSL_GUARDED_BY(mu_);            // the budget's bucket, in bytes
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
  std::string probing_ ABSL_GUARDED_BY(mu_);  // the IPv4 address being probed; "" when none
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// "host:port" -> an IPv4 address (resolving a name) and a port.
absl::StatusOr<std::pair<std::string, int>> ResolveProbeAddress(const std::string& host_port);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_PROBER_H_
