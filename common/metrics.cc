#include "common/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace longhaul::common {
namespace {

// The process gauge in `r` (the same series however often it is asked for: the registry merges a
// family registered again under the same name and help).
prometheus::Gauge& ResidentBytesGauge(prometheus::Registry& r) {
  return prometheus::BuildGauge()
      .Name("longhaul_process_resident_memory_bytes")
      .Help("Resident memory of this process (from /proc/self/statm)")
      .Register(r)
      .Add({});
}

// Resident pages times the page size; 0 where /proc is not there.
double ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace

std::shared_ptr<prometheus::Registry> MetricsRegistry() {
  static auto* r = [] {
    auto* p = new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
    ResidentBytesGauge(**p);  // the process family exists from the start
    return p;
  }();
  return *r;
}

std::string CheckMetricName(const std::string& name, prometheus::MetricType type) {
  if (!absl::StartsWith(name, "longhaul_")) return absl::StrCat(name, ": does not start with longhaul_");
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return absl::StrCat(name, ": not lower snake case");
    }
  }
  const bool total = absl::EndsWith(name, "_total");
  if (type == prometheus::MetricType::Counter && !total) return absl::StrCat(name, ": a counter must end in _total");
  if (type != prometheus::MetricType::Counter && total) return absl::StrCat(name, ": only counters end in _total");
  // Base units only: seconds and bytes, never their multiples.
  for (const char* unit : {"_ms", "_milliseconds", "_microseconds", "_minutes", "_hours", "_kb", "_mb", "_gb",
                           "_kib", "_mib", "_gib", "_kilobytes", "_megabytes", "_bits"}) {
    if (absl::StrContains(absl::StrCat(name, "_"), absl::StrCat(unit, "_"))) {
      return absl::StrCat(name, ": not in base units (", unit + 1, ")");
    }
  }
  return "";
}

std::string AdvertisedAddress(const std::string& listen, int port, const std::string& advertise_host) {
  std::string host = advertise_host;
  if (host.empty()) {
    const size_t colon = listen.rfind(':');
    host = colon == std::string::npos ? "" : listen.substr(0, colon);
    if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  bool fallback_to_free_port, std::string* note) {
  if (!MetricsEnabled(listen)) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(listen, MetricsRegistry());
  if (s.ok() || !fallback_to_free_port || s.status().code() != absl::StatusCode::kUnavailable) return s;
  const std::string any = absl::StrCat(listen.substr(0, listen.rfind(':')), ":0");
  absl::StatusOr<std::unique_ptr<MetricsServer>> f = MetricsServer::Start(any, MetricsRegistry());
  if (f.ok() && note != nullptr) {
    *note = absl::StrCat("metrics: ", listen, " is taken, serving on port ", (*f)->port(), " instead");
  }
  return f.ok() ? std::move(f) : std::move(s);
}

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry) : registry_(std::move(registry)) {}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                   std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", listen, "\" is not HOST:PORT (or none)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), listen.substr(colon + 1).c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address ", listen, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer(std::move(registry)));
  s->fd_ = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  const bool ok = s->fd_ >= 0 && setsockopt(s->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                  bind(s->fd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(s->fd_, 16) == 0;
  const int err = errno;
  freeaddrinfo(res);
  if (!ok) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", std::strerror(err)));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(s->fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return absl::InternalError(absl::StrCat("metrics server: getsockname: ", std::strerror(errno)));
  }
  s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(s->wake_, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  s->Serve("/metrics", "text/plain; version=0.0.4; charset=utf-8", [p = s.get()] { return p->Scrape(); });
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const char c = 0;
    (void)!write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsServer::OnScrape(std::function<void()> refresh) {
  absl::MutexLock l(&mu_);
  refresh_.push_back(std::move(refresh));
}

void MetricsServer::Serve(const std::string& path, const std::string& content_type, std::function<std::string()> body) {
  absl::MutexLock l(&mu_);
  handlers_[path] = Handler{content_type, std::move(body)};
}

std::string MetricsServer::Scrape() {
  ResidentBytesGauge(*registry_).Set(ResidentBytes());
  std::vector<std::function<void()>> refresh;
  {
    absl::MutexLock l(&mu_);
    refresh = refresh_;
  }
  for (const auto& f : refresh) f();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void MetricsServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // the destructor
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      // Out of descriptors or memory: poll would report the pending connection again at once.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(100 * 1000);
      continue;
    }
    Answer(conn);
    close(conn);
  }
}

// One request per connection (HTTP/1.0 semantics, "Connection: close"): a scraper sends a few
// hundred bytes of GET. The whole exchange has one deadline (a slow or silent client cannot hold
// the server's only thread, nor its shutdown, for longer), and a request head is at most 8 KiB.
void MetricsServer::Answer(int conn) {
  constexpr size_t kMaxRequestBytes = 8192;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  // Waits until `conn` is ready for `events` or the deadline passes.
  auto ready = [&](short events) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{conn, events, 0};
    return ms > 0 && poll(&p, 1, static_cast<int>(ms)) == 1;
  };
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < kMaxRequestBytes) {
    if (!ready(POLLIN)) return;
    const ssize_t n = recv(conn, buf, sizeof(buf), 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  const std::vector<std::string> first = absl::StrSplit(req.substr(0, req.find("\r\n")), ' ');
  std::string status = "200 OK", type = "text/plain; charset=utf-8", body;
  if (req.find("\r\n\r\n") == std::string::npos) {
    status = "431 Request Header Fields Too Large";
    body = "request head above 8 KiB\n";
  } else if (first.size() < 2 || first[0] != "GET") {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else {
    const std::string path = first[1].substr(0, first[1].find('?'));
    Handler h;
    {
      absl::MutexLock l(&mu_);
      auto it = handlers_.find(path);
      if (it != handlers_.end()) h = it->second;
    }
    if (!h.body) {
      status = "404 Not Found";
      body = absl::StrCat("no ", path, " here (/metrics)\n");
    } else {
      type = h.content_type;
      body = h.body();
    }
  }
  const std::string reply = absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ",
                                         body.size(), "\r\nConnection: close\r\n\r\n", body);
  for (size_t done = 0; done < reply.size();) {
    if (!ready(POLLOUT)) return;
    const ssize_t n = send(conn, reply.data() + done, reply.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace longhaul::common
