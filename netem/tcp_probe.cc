#include "netem/tcp_probe.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::netem {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr size_t kBufferBytes = 1 << 20;
constexpr std::array<char, 4> kMagic = {'L', 'H', 'P', 'R'};
constexpr size_t kHeaderBytes = 16;
constexpr int kMaxPings = 1000;
constexpr uint64_t kRefused = std::numeric_limits<uint64_t>::max();
constexpr int kStallSeconds = 30;

struct Header {
  uint32_t pings = 0;
  uint64_t bytes = 0;
};

std::array<char, kHeaderBytes> EncodeHeader(const Header& h) {
  std::array<char, kHeaderBytes> b{};
  std::memcpy(b.data(), kMagic.data(), 4);
  std::memcpy(b.data() + 4, &h.pings, 4);
  std::memcpy(b.data() + 8, &h.bytes, 8);
  return b;
}

absl::StatusOr<tcp::endpoint> Endpoint(const std::string& ipv4, int port) {
  boost::system::error_code ec;
  const asio::ip::address_v4 a = asio::ip::make_address_v4(ipv4, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad IPv4 address \"", ipv4, "\""));
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("bad port ", port));
  return tcp::endpoint(a, static_cast<uint16_t>(port));
}

// Blocking reads and writes on this socket give up after `seconds` without progress (a stalled
// peer cannot hold a sink or a probe forever).
void SetStallTimeout(tcp::socket& s, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

std::string RemoteIpv4(const tcp::socket& s) {
  boost::system::error_code ec;
  const tcp::endpoint ep = s.remote_endpoint(ec);
  return ec ? std::string() : ep.address().to_string();
}

// One probe connection on the sink side; returns when it is done or broken.
void ServeOne(tcp::socket& s, int64_t max_bytes, const std::function<bool(const std::string&)>& busy,
              std::vector<char>& buf) {
  boost::system::error_code ec;
  SetStallTimeout(s, kStallSeconds);
  std::array<char, kHeaderBytes> raw{};
  if (asio::read(s, asio::buffer(raw), ec) != raw.size() || ec) return;
  Header h;
  std::memcpy(&h.pings, raw.data() + 4, 4);
  std::memcpy(&h.bytes, raw.data() + 8, 8);
  const bool refuse = std::memcmp(raw.data(), kMagic.data(), 4) != 0 || h.pings > kMaxPings ||
                      h.bytes > static_cast<uint64_t>(max_bytes) || (busy && busy(RemoteIpv4(s)));
  const uint64_t answer = refuse ? kRefused : 0;
  if (asio::write(s, asio::buffer(&answer, sizeof(answer)), ec) != sizeof(answer) || ec || refuse) return;
  for (uint32_t i = 0; i < h.pings; ++i) {
    char c;
    if (asio::read(s, asio::buffer(&c, 1), ec) != 1 || ec) return;
    if (asio::write(s, asio::buffer(&c, 1), ec) != 1 || ec) return;
  }
  uint64_t got = 0;
  while (got < h.bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), h.bytes - got));
    const size_t n = s.read_some(asio::buffer(buf.data(), want), ec);
    if (ec) return;
    got += n;
  }
  asio::write(s, asio::buffer(&got, sizeof(got)), ec);
}

// A connected socket, retrying for `patience` while the sink may still be starting; with the
// congestion control `congestion` unless it is empty (the machine's default), paced by the kernel
// at `pace_mbit` when above 0 (SO_MAX_PACING_RATE: TCP's internal pacing, which counts payload
// bytes; the fq qdisc would count whole packets).
absl::StatusOr<tcp::socket> Connect(asio::io_context& io, const std::string& ipv4, int port, absl::Duration patience,
                                    const std::string& congestion = "", double pace_mbit = 0) {
  if (!(pace_mbit >= 0 && pace_mbit <= kMaxPaceMbit)) {
    return absl::InvalidArgumentError(absl::StrCat("pace ", pace_mbit, " Mbit/s not in [0, ", kMaxPaceMbit, "]"));
  }
  absl::StatusOr<tcp::endpoint> ep = Endpoint(ipv4, port);
  if (!ep.ok()) return ep.status();
  const absl::Time give_up = absl::Now() + patience;
  tcp::socket s(io);
  for (;;) {
    boost::system::error_code ec;
    s.connect(*ep, ec);
    if (!ec) break;
    s.close();
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", ipv4, ":", port, ": ", ec.message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  s.set_option(tcp::no_delay(true));
  SetStallTimeout(s, kStallSeconds);
  if (!congestion.empty() && setsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, congestion.data(),
                                        static_cast<socklen_t>(congestion.size())) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("TCP congestion control \"", congestion, "\": ", std::strerror(errno),
                                                   " (see /proc/sys/net/ipv4/tcp_available_congestion_control)"));
  }
  if (pace_mbit > 0) {
    const auto bytes_per_s = static_cast<uint32_t>(pace_mbit * 1e6 / 8);
    if (setsockopt(s.native_handle(), SOL_SOCKET, SO_MAX_PACING_RATE, &bytes_per_s, sizeof(bytes_per_s)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("pacing at ", pace_mbit, " Mbit/s (SO_MAX_PACING_RATE): ",
                                                     std::strerror(errno)));
    }
  }
  return s;
}

// The client side: header, pings (their round-trip times), data, confirmation.
struct ProbeResult {
  std::vector<absl::Duration> rtts;
  double seconds = 0;
};

absl::StatusOr<ProbeResult> RunProbe(const std::string& ipv4, int port, const Header& h, absl::Duration patience,
                                     const std::string& congestion = "", double pace_mbit = 0) {
  asio::io_context io;
  absl::StatusOr<tcp::socket> s = Connect(io, ipv4, port, patience, congestion, pace_mbit);
  if (!s.ok()) return s.status();
  const std::string where = absl::StrCat(ipv4, ":", port);
  boost::system::error_code ec;
  const std::array<char, kHeaderBytes> head = EncodeHeader(h);
  if (asio::write(*s, asio::buffer(head), ec); ec) {
    return absl::UnavailableError(absl::StrCat("probe of ", where, ": ", ec.message()));
  }
  uint64_t answer = 0;
  if (asio::read(*s, asio::buffer(&answer, sizeof(answer)), ec); ec) {
    return absl::UnavailableError(absl::StrCat("probe of ", where, ": no answer to the probe's header: ", ec.message()));
  }
  if (answer == kRefused) {
    return absl::ResourceExhaustedError(absl::StrCat("the sink at ", where, " refused a probe of ", h.bytes,
                                                     " bytes and ", h.pings, " pings (above its per-probe cap)"));
  }
  ProbeResult r;
  for (uint32_t i = 0; i < h.pings; ++i) {
    char c = 'p';
    const absl::Time t = absl::Now();
    asio::write(*s, asio::buffer(&c, 1), ec);
    if (!ec) asio::read(*s, asio::buffer(&c, 1), ec);
    if (ec) return absl::UnavailableError(absl::StrCat("probe of ", where, ": ping ", i, ": ", ec.message()));
    r.rtts.push_back(absl::Now() - t);
  }
  std::vector<char> buf(kBufferBytes, 'x');
  const absl::Time t0 = absl::Now();
  uint64_t sent = 0;
  while (sent < h.bytes) {
    // write_some, not asio::write: the latter hands the kernel at most 64 KiB per call, which
    // halved this reference's throughput on a 2-core machine.
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), h.bytes - sent));
    const size_t w = s->write_some(asio::buffer(buf.data(), n), ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("write to ", where, " failed after ", sent, " bytes: ", ec.message()));
    }
    sent += w;
  }
  uint64_t got = 0;
  asio::read(*s, asio::buffer(&got, sizeof(got)), ec);
  r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (ec) return absl::DataLossError(absl::StrCat("the sink at ", where, " did not confirm ", h.bytes, " bytes: ", ec.message()));
  if (got != h.bytes) {
    return absl::DataLossError(absl::StrCat("the sink at ", where, " confirmed ", got, " of ", h.bytes, " bytes"));
  }
  return r;
}

}  // namespace

struct TcpSink::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stopping{false};
  // The descriptors Stop shuts down: the listening socket's and the connection's being served
  // (-1: none). Under a mutex so that Stop never touches a descriptor after its socket closed.
  std::mutex mu;
  int listen_fd = -1;
  int serving_fd = -1;
  std::function<bool(const std::string&)> busy;  // set before Serve; read on Serve's thread only
};

void TcpSink::SetBusy(std::function<bool(const std::string& from_ipv4)> busy) { impl_->busy = std::move(busy); }

TcpSink::TcpSink(TcpSink&&) noexcept = default;
TcpSink& TcpSink::operator=(TcpSink&&) noexcept = default;
TcpSink::~TcpSink() = default;

absl::StatusOr<TcpSink> TcpSink::Listen(const std::string& ipv4, int port, int64_t max_probe_bytes) {
  absl::StatusOr<tcp::endpoint> ep = Endpoint(ipv4, port);
  if (!ep.ok()) return ep.status();
  if (max_probe_bytes < 0) return absl::InvalidArgumentError("negative per-probe cap");
  TcpSink s;
  s.impl_ = std::make_unique<Impl>();
  s.max_probe_bytes_ = max_probe_bytes;
  boost::system::error_code ec;
  tcp::acceptor& a = s.impl_->acceptor;
  a.open(ep->protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(*ep, ec);
  if (!ec) a.listen(8, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot listen on ", ipv4, ":", port, ": ", ec.message()));
  s.port_ = a.local_endpoint().port();
  s.impl_->listen_fd = a.native_handle();
  return s;
}

void TcpSink::Serve(int connections) {
  std::vector<char> buf(kBufferBytes);
  for (int served = 0; (connections <= 0 || served < connections) && !impl_->stopping;) {
    boost::system::error_code ec;
    tcp::socket s(impl_->io);
    impl_->acceptor.accept(s, ec);
    if (impl_->stopping) break;
    if (ec == asio::error::interrupted || ec == asio::error::connection_aborted) continue;
    if (ec) break;
    {
      std::lock_guard<std::mutex> l(impl_->mu);
      impl_->serving_fd = s.native_handle();
    }
    if (!impl_->stopping) ServeOne(s, max_probe_bytes_, impl_->busy, buf);
    {
      std::lock_guard<std::mutex> l(impl_->mu);
      impl_->serving_fd = -1;
    }
    ++served;
  }
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->listen_fd = -1;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

void TcpSink::Stop() {
  if (!impl_) return;
  impl_->stopping = true;
  std::lock_guard<std::mutex> l(impl_->mu);
  // shutdown(2) wakes a thread blocked in accept(2) or read(2) on Linux; close(2) would not.
  if (impl_->listen_fd >= 0) ::shutdown(impl_->listen_fd, SHUT_RDWR);
  if (impl_->serving_fd >= 0) ::shutdown(impl_->serving_fd, SHUT_RDWR);
}

absl::StatusOr<double> TimedTcpSend(const std::string& ipv4, int port, int64_t bytes, absl::Duration patience,
                                    const std::string& congestion, double pace_mbit) {
  if (bytes < 0) return absl::InvalidArgumentError("negative byte count");
  absl::StatusOr<ProbeResult> r =
      RunProbe(ipv4, port, Header{0, static_cast<uint64_t>(bytes)}, patience, congestion, pace_mbit);
  if (!r.ok()) return r.status();
  return r->seconds;
}

absl::StatusOr<LinkMeasurement> ProbeLink(const std::string& ipv4, int port, const ProbeOptions& o) {
  if (o.pings < 1 || o.pings > kMaxPings) {
    return absl::InvalidArgumentError(absl::StrCat("pings ", o.pings, " not in [1, ", kMaxPings, "]"));
  }
  if (o.bytes < 1) return absl::InvalidArgumentError("a probe needs at least one byte of data");
  absl::StatusOr<ProbeResult> r =
      RunProbe(ipv4, port, Header{static_cast<uint32_t>(o.pings), static_cast<uint64_t>(o.bytes)}, o.connect_patience);
  if (!r.ok()) return r.status();
  std::sort(r->rtts.begin(), r->rtts.end());
  LinkMeasurement m;
  m.rtt = r->rtts[r->rtts.size() / 2];
  m.bytes = o.bytes;
  m.mbit_per_s = r->seconds > 0 ? static_cast<double>(o.bytes) * 8 / r->seconds / 1e6 : 0.0;
  return m;
}

}  // namespace longhaul::netem
