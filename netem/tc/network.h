// Emulated networks from Linux network namespaces, veth pairs, a bridge and tc (root only).
//
// Topology file (YAML):
//   name: lh              # prefix of every object: namespaces <name>-<host> and <name>-sw (<= 6 chars)
//   subnet: 10.77.0       # a /24; host i (0-based, in file order) gets <subnet>.<i + 2>
//   tcp_congestion: cubic # every host's TCP congestion control (default cubic; "host": the machine's)
//   hosts:
//     - {name: a, rate_mbit: 100, delay_ms: 20, jitter_ms: 2, loss: 0.001}
//     - {name: b, rate_mbit: 50, queue_ms: 400}
// Every host has one access link to a bridge in the switch namespace <name>-sw; its rate limits
// both directions (tc tbf on the host's eth0 and on the bridge port), each direction queueing at
// most queue_ms of traffic at the rate (default 400; beyond it packets are dropped). The root
// namespace is joined to the bridge too (veth <name>-up, address <subnet>.1), so tools there can
// reach every host. delay/jitter/loss use tc netem when the kernel has it (detected at `up`,
// reported); otherwise `up` says so and they must come from the in-process shaper (the job spec's
// `links:` section).
//
// Each host's TCP connections use the topology's congestion control (set on the route they take,
// `congctl`; a namespace otherwise takes the machine's default at its creation), so that runs on
// machines configured differently emulate the same hosts: Linux's default, cubic, unless the
// topology says otherwise. BBR (the default of the development VM and of the GPU machines) keeps
// at most about twice the bandwidth-delay product it measured in flight; with ACKs queued behind
// a host's own uploads on its shaped uplink it under-fills the link (a 4-stage GPipe pipeline at
// 20 Mbit/s: 0.68-0.75 of its link bound with BBR, 0.88-0.89 with cubic; docs/netem-sweep.md).
//
// Regions (optional): hosts may name a region, and the topology a rate between regions:
//   between_regions: {rate_mbit: 2}         # default queue_ms 400
//   hosts:
//     - {name: a1, region: east, rate_mbit: 200}
//     - {name: b1, region: west, rate_mbit: 200}
// Traffic from a host to a host of another region is paced at between_regions.rate_mbit on the
// sender's egress (one htb class per such destination, which a u32 filter on its address sends
// it to; the rest of its traffic goes at its own rate_mbit), so hosts of a region talk fast among
// themselves and slowly to the others, each pair at its own rate: per-pair rates on one bridge. Hosts without a region (a coordinator) are neither
// slowed nor slow to reach. Not with delay_ms/jitter/loss on a host of a region (the netem qdisc
// would have to sit under the htb classes), nor with SetRate.
//
//   auto topo = ParseTopology(yaml);   Network net(*topo, RunCommand);   net.Up();  ...  net.Down();
#ifndef LONGHAUL_NETEM_TC_NETWORK_H_
#define LONGHAUL_NETEM_TC_NETWORK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::netem {

struct HostSpec {
  std::string name;
  double rate_mbit = 0;  // 0: unlimited
  double delay_ms = 0, jitter_ms = 0, loss = 0;
  // The tbf queue: this much traffic at rate_mbit waits, more is dropped. Shallow queues make
  // TCP lose packets whenever its sending rate overshoots the link (BBR's bandwidth probes do).
  double queue_ms = 400;
  std::string region = "";  // none
};

// Topology::tcp_congestion's value that keeps the machine's own congestion control.
inline constexpr char kMachineCongestion[] = "host";

// The TCP payload a tbf-shaped link of `mbit` carries at most: each full 1,514-byte frame on the
// veth (MTU 1500) holds 1,448 bytes of payload after the Ethernet, IP and TCP headers (timestamps
// on, Linux's default). Measured: 287.0 Mbit/s of TCP goodput at 300 (0.957; this gives 0.956).
inline double TcpPayloadMbit(double mbit) { return mbit * 1448.0 / 1514.0; }

struct Topology {
  std::string name = "lh";
  std::string subnet = "10.77.0";
  std::string tcp_congestion = "cubic";  // kMachineCongestion: leave the machine's
  std::vector<HostSpec> hosts;
  // Between hosts of different regions (both named): at most this rate from each sender. 0: no
  // region shaping.
  double between_regions_mbit = 0;
  double between_regions_queue_ms = 400;
  std::string Namespace(const std::string& host) const { return name + "-" + host; }
  std::string SwitchNamespace() const { return name + "-sw"; }
  // Address of a host, or "" if unknown.
  std::string Address(const std::string& host) const;
};

// Whether `name` can be Topology::tcp_congestion (at most 15 letters, digits and _): the error
// quotes it and says what may be.
absl::Status CheckCongestion(const std::string& name);

// Every problem listed, one per line.
absl::StatusOr<Topology> ParseTopology(const std::string& yaml);

// Runs argv; returns its exit status and, on failure, its stderr in the message.
using CommandRunner = std::function<absl::Status(const std::vector<std::string>& argv)>;
absl::Status RunCommand(const std::vector<std::string>& argv);
// The same, returning what the command printed on stdout.
using OutputRunner = std::function<absl::StatusOr<std::string>(const std::vector<std::string>& argv)>;
absl::StatusOr<std::string> RunCommandOutput(const std::vector<std::string>& argv);

// What a root qdisc has sent (tc -s): bytes and packets as they left, packets it dropped.
struct QdiscCounters {
  int64_t bytes = 0, packets = 0, drops = 0;
};
absl::StatusOr<QdiscCounters> ParseQdiscCounters(const std::string& tc_s_output);
// One host's access link: `up` is its egress (eth0), `down` the bridge port's egress towards it.
struct HostCounters {
  std::string host;
  QdiscCounters up, down;
};

class Network {
 public:
  Network(Topology t, CommandRunner run, OutputRunner output = RunCommandOutput)
      : t_(std::move(t)), run_(std::move(run)), output_(std::move(output)) {}
  // Builds everything; on any failure (or when `interrupted` returns true between steps) removes
  // what was built and returns the error.
  absl::Status Up(const std::function<bool()>& interrupted = [] { return false; });
  // Removes every namespace of the topology (and so their veths, bridge and qdiscs). Idempotent.
  absl::Status Down();
  // Whether tc netem works here (probed in a scratch namespace).
  bool NetemAvailable();
  // Re-shapes every host's access link (both directions) to `mbit` (0: unshaped), keeping each
  // host's queue_ms. For experiments that sweep rates on a network that is up; hosts with netem
  // qdiscs and topologies with regions are not supported.
  absl::Status SetRate(double mbit);
  // Goodput in Mbit/s of one TCP connection carrying `bytes` from this (the root) namespace to a
  // sink in `host`'s namespace: through the uplink (unshaped) and `host`'s shaped download. What
  // an application can get from a link of the configured rate after TCP/IP/Ethernet headers.
  absl::StatusOr<double> TcpGoodputTo(const std::string& host, int64_t bytes);
  // Every host's access-link counters since its qdiscs were last made (Up or SetRate); an unshaped
  // link reports its default qdisc's (usually zeros).
  absl::StatusOr<std::vector<HostCounters>> Counters();
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  Topology t_;
  CommandRunner run_;
  OutputRunner output_;
  std::vector<std::string> notes_;
};

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_TC_NETWORK_H_
