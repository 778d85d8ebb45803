// Plain TCP, the reference every link and transport measurement compares with: a sink that reads
// each connection to the end and answers with the byte count, and a sender that times N bytes to
// a sink until that answer arrives (so the time covers delivery, not just the local send buffer).
//
//   auto sink = TcpSink::Listen("127.0.0.1", 0);   std::thread([&] { sink->Serve(); }).detach();
//   absl::StatusOr<double> s = TimedTcpSend("127.0.0.1", sink->port(), 1 << 30);
#ifndef LONGHAUL_NETEM_TCP_PROBE_H_
#define LONGHAUL_NETEM_TCP_PROBE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace longhaul::netem {

class TcpSink {
 public:
  // port 0: any free port (see port()).
  static absl::StatusOr<TcpSink> Listen(const std::string& ipv4, int port);
  int port() const { return port_; }
  // Serves connections one after another (run it on its own thread or process): forever, or
  // `connections` of them and then closes the listening socket.
  void Serve(int connections = 0);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Seconds from connect to the sink's confirmation of all `bytes`. Retries the connection for up to
// `connect_patience` (the sink may still be starting).
absl::StatusOr<double> TimedTcpSend(const std::string& ipv4, int port, int64_t bytes,
                                    absl::Duration connect_patience = absl::ZeroDuration());

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_TCP_PROBE_H_
