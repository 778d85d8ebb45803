#include "netem/tcp_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::netem {
namespace {

constexpr size_t kBufferBytes = 1 << 20;

absl::StatusOr<sockaddr_in> Address(const std::string& ipv4, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ipv4.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("bad IPv4 address \"", ipv4, "\""));
  }
  return a;
}

}  // namespace

absl::StatusOr<TcpSink> TcpSink::Listen(const std::string& ipv4, int port) {
  absl::StatusOr<sockaddr_in> a = Address(ipv4, port);
  if (!a.ok()) return a.status();
  TcpSink s;
  s.fd_ = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s.fd_, reinterpret_cast<sockaddr*>(&*a), sizeof(*a)) != 0 || listen(s.fd_, 8) != 0) {
    const std::string err = std::strerror(errno);
    close(s.fd_);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", ipv4, ":", port, ": ", err));
  }
  socklen_t len = sizeof(*a);
  getsockname(s.fd_, reinterpret_cast<sockaddr*>(&*a), &len);
  s.port_ = ntohs(a->sin_port);
  return s;
}

void TcpSink::Serve(int connections) {
  std::vector<char> buf(kBufferBytes);
  for (int served = 0; connections <= 0 || served < connections;) {
    const int fd = accept(fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;
    }
    int64_t got = 0;
    ssize_t n;
    while ((n = read(fd, buf.data(), buf.size())) > 0) got += n;
    (void)!write(fd, &got, sizeof(got));
    close(fd);
    ++served;
  }
  close(fd_);
  fd_ = -1;
}

absl::StatusOr<double> TimedTcpSend(const std::string& ipv4, int port, int64_t bytes, absl::Duration patience) {
  absl::StatusOr<sockaddr_in> a = Address(ipv4, port);
  if (!a.ok()) return a.status();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const absl::Time give_up = absl::Now() + patience;
  while (connect(fd, reinterpret_cast<sockaddr*>(&*a), sizeof(*a)) != 0) {
    if (absl::Now() >= give_up) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("cannot connect to ", ipv4, ":", port, ": ", std::strerror(errno)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::vector<char> buf(kBufferBytes, 'x');
  const absl::Time t0 = absl::Now();
  int64_t sent = 0;
  while (sent < bytes) {
    const ssize_t n = write(fd, buf.data(), static_cast<size_t>(std::min<int64_t>(buf.size(), bytes - sent)));
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("write to ", ipv4, ":", port, " failed after ", sent, " bytes"));
    }
    sent += n;
  }
  shutdown(fd, SHUT_WR);
  int64_t got = 0;
  const bool confirmed = read(fd, &got, sizeof(got)) == sizeof(got) && got == bytes;
  const double s = absl::ToDoubleSeconds(absl::Now() - t0);
  close(fd);
  if (!confirmed) return absl::DataLossError(absl::StrCat("the sink at ", ipv4, ":", port, " did not confirm ", bytes, " bytes"));
  return s;
}

}  // namespace longhaul::netem
