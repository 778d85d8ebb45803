// Plain TCP on Boost.Asio: the reference every link and transport measurement compares with, and
// the probe that measures a link between two machines.
//
// A TcpSink serves probe connections one after another. Each starts with a 16-byte header
// ("LHPR", u32 pings, u64 bytes, little-endian) that the sink answers with a u64: 0 to go on, all
// ones to refuse (a bad header, more pings than 1000 or more bytes than the sink's per-probe cap;
// a refused probe costs the sink nothing more). It then echoes `pings` single bytes (the
// round-trip time), reads exactly `bytes` and answers with the count, so the sender's clock covers
// delivery, not just its send buffer.
//
//   auto sink = TcpSink::Listen("127.0.0.1", 0, /*max_probe_bytes=*/1 << 30);
//   std::thread([&] { sink->Serve(); }).detach();
//   absl::StatusOr<double> s = TimedTcpSend("127.0.0.1", sink->port(), 1 << 30);  // seconds
//   absl::StatusOr<LinkMeasurement> m = ProbeLink("127.0.0.1", sink->port(), {.bytes = 4 << 20});
//
// Threading: Serve blocks its thread; Listen/port may be called from any thread before it, Stop at
// any time.
#ifndef LONGHAUL_NETEM_TCP_PROBE_H_
#define LONGHAUL_NETEM_TCP_PROBE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace longhaul::netem {

// What one probe of a sink caps by default: enough for a link's throughput, bounded for WAN links.
inline constexpr int64_t kDefaultMaxProbeBytes = int64_t{64} << 20;

class TcpSink {
 public:
  // port 0: any free port (see port()). A probe of more than `max_probe_bytes` is refused.
  static absl::StatusOr<TcpSink> Listen(const std::string& ipv4, int port,
                                        int64_t max_probe_bytes = kDefaultMaxProbeBytes);
  TcpSink(TcpSink&&) noexcept;
  TcpSink& operator=(TcpSink&&) noexcept;
  ~TcpSink();
  int port() const { return port_; }
  int64_t max_probe_bytes() const { return max_probe_bytes_; }
  // Serves connections one after another (run it on its own thread or process): forever, or
  // `connections` of them and then closes the listening socket. A connection that stalls for
  // 30 s is dropped.
  void Serve(int connections = 0);
  // Makes Serve return soon, from any thread (the listening socket and a connection being served
  // are shut down); later calls of Serve return at once.
  void Stop();
  // Consulted for each probe after its header: a probe from a host for which `busy(ipv4)` is true
  // is refused like one above the cap (a worker refuses the host its own prober is probing, so
  // that two probes do not share one link). Set it before Serve starts; it runs on Serve's thread.
  void SetBusy(std::function<bool(const std::string& from_ipv4)> busy);

 private:
  struct Impl;
  TcpSink() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  int64_t max_probe_bytes_ = 0;
};

inline constexpr double kMaxPaceMbit = 34000;  // SO_MAX_PACING_RATE's 32-bit bytes per second

// Seconds from the first byte of data to the sink's confirmation of all `bytes`. Retries the
// connection for up to `connect_patience` (the sink may still be starting). `congestion`: the
// socket's TCP congestion control (TCP_CONGESTION), or empty for the machine's default.
// `pace_mbit` > 0: the kernel paces the socket at that rate (SO_MAX_PACING_RATE; TCP's internal
// pacing counts payload bytes and leaves the first ten segments unpaced), at most kMaxPaceMbit.
absl::StatusOr<double> TimedTcpSend(const std::string& ipv4, int port, int64_t bytes,
                                    absl::Duration connect_patience = absl::ZeroDuration(),
                                    const std::string& congestion = "", double pace_mbit = 0);

struct ProbeOptions {
  int64_t bytes = 4 << 20;  // data timed for the throughput (at most the sink's cap)
  int pings = 5;            // single-byte round trips timed for the RTT, 1..1000
  absl::Duration connect_patience = absl::ZeroDuration();
};

struct LinkMeasurement {
  absl::Duration rtt;     // median of the pings
  double mbit_per_s = 0;  // bytes * 8 / seconds to confirmation / 1e6
  int64_t bytes = 0;
};

absl::StatusOr<LinkMeasurement> ProbeLink(const std::string& ipv4, int port, const ProbeOptions& options = {});

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_TCP_PROBE_H_
