#include "tools/cluster/local_cluster.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>
#include <boost/process/search_path.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/list_dir.h"
#include "common/read_file.h"
#include "security/pki.h"
#include "security/tls.h"

namespace longhaul::cluster {

namespace bp = boost::process;

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv, const std::string& log) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  // Appended to (a restarted coordinator keeps its log) and close-on-exec: the child gets it only
  // as its stdout and stderr.
  std::FILE* f = std::fopen(log.c_str(), "ae");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", log, ": ", std::strerror(errno)));
  std::error_code ec;
  auto child = std::make_unique<bp::child>(bp::exe = argv[0],
                                           bp::args = std::vector<std::string>(argv.begin() + 1, argv.end()),
                                           (bp::std_out & bp::std_err) > f, ec);
  std::fclose(f);
  if (ec) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", ec.message()));
  return std::make_unique<Process>(std::move(child));
}

Process::Process(std::unique_ptr<bp::child> child) : child_(std::move(child)) {}

Process::~Process() {
  if (running()) {
    Signal(SIGKILL);
    Wait(absl::Seconds(5));
  }
}

pid_t Process::pid() const { return child_->id(); }

void Process::Signal(int sig) {
  if (!reaped_) kill(child_->id(), sig);
}

bool Process::running() {
  if (reaped_) return false;
  std::error_code ec;
  if (child_->running(ec)) return true;
  reaped_ = true;
  return false;
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() > end) return -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const int status = child_->native_exit_code();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Cluster::Cluster(int threads) : threads_(threads) {
  // Under $TMPDIR when set (checkpoints of large models need a real disk, not a small /tmp).
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/longhaul-it-XXXXXX");
  const char* made = mkdtemp(tmpl.data());
  dir_ = made != nullptr ? made : "";
}

Cluster::~Cluster() {
  for (auto& [name, w] : workers_) w->Signal(SIGTERM);
  for (auto& [name, w] : workers_) w->Wait(absl::Seconds(10));
  if (coordinator_) {
    coordinator_->Signal(SIGTERM);
    coordinator_->Wait(absl::Seconds(10));
  }
  workers_.clear();
  coordinator_.reset();
  // (Not std::filesystem::remove_all, which breaks in binaries linking the PyTorch wheel: list_dir.h.)
  if (!std::getenv("LONGHAUL_KEEP_TEST_DIRS")) (void)common::RemoveTree(dir_);
}

void Cluster::SignalAll(int sig) {
  for (auto& [name, w] : workers_) w->Signal(sig);
  if (coordinator_) coordinator_->Signal(sig);
}

std::vector<std::string> Cluster::Prefix(const std::string& role) const {
  if (!placement_.ns) return {};
  // ip from PATH (machines without iproute2 carry one, tools/gpu/fetch-debs.sh), else the usual place.
  static const std::string ip = [] {
    const boost::filesystem::path p = boost::process::search_path("ip");
    return p.empty() ? std::string("/usr/sbin/ip") : p.string();
  }();
  return {ip, "netns", "exec", placement_.ns(role)};
}

std::string Cluster::Host(const std::string& role) const {
  return placement_.host ? placement_.host(role) : "127.0.0.1";
}

std::string Cluster::Bin(const std::string& name) { return absl::StrCat(LONGHAUL_BIN_DIR, "/", name); }

absl::Status Cluster::StartCoordinator() {
  const std::string port_file = absl::StrCat(dir_, "/coordinator.port");
  const std::string metrics_port_file = absl::StrCat(dir_, "/coordinator.metrics-port");
  std::filesystem::remove(port_file);
  std::filesystem::remove(metrics_port_file);
  std::vector<std::string> argv = Prefix("coordinator");
  argv.insert(argv.end(), {Bin("longhaul-coordinator"),
                           // A restart reuses the port, so running workers find the new coordinator.
                           address_.empty() ? absl::StrCat("--listen=", Host("coordinator"), ":0")
                                            : absl::StrCat("--listen=", address_),
                           absl::StrCat("--port-file=", port_file), absl::StrCat("--state=", dir_, "/coordinator.db"),
                           "--heartbeat-timeout=3s", "--heartbeat-interval=300ms",
                           absl::StrCat("--metrics-listen=", Host("coordinator"), ":0"),
                           absl::StrCat("--metrics-port-file=", metrics_port_file)});
  if (insecure_) argv.push_back("--insecure");
  argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, absl::StrCat(dir_, "/coordinator.log"));
  if (!p.ok()) return p.status();
  coordinator_ = std::move(*p);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  for (;;) {
    // The metrics port file is written before the control-plane one.
    std::ifstream f(port_file), mf(metrics_port_file);
    int port = 0, metrics_port = 0;
    if (f >> port && port > 0) {
      address_ = absl::StrCat(Host("coordinator"), ":", port);
      metrics_address_ = mf >> metrics_port ? absl::StrCat(Host("coordinator"), ":", metrics_port) : "";
      return Connect();
    }
    if (!coordinator_->running()) return absl::InternalError("the coordinator exited at start-up");
    if (absl::Now() > end) return absl::DeadlineExceededError("the coordinator did not start");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Cluster::Connect() {
  if (insecure_) {
    stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    return absl::OkStatus();
  }
  security::KeyAndCert admin;
  std::string ca;
  for (auto [file, out] : {std::pair{"/ca.crt", &ca}, std::pair{"/admin.crt", &admin.cert_pem},
                           std::pair{"/admin.key", &admin.key_pem}}) {
    absl::StatusOr<std::string> text = common::ReadFile(pki_dir() + file);
    if (!text.ok()) return text.status();
    *out = *text;
  }
  stub_ = v1::Coordinator::NewStub(security::SecureChannel(address_, security::ChannelCredentials(ca, &admin),
                                                           security::kCoordinatorServerName, grpc::ChannelArguments()));
  absl::StatusOr<std::string> fp = security::Fingerprint(ca);
  if (!fp.ok()) return fp.status();
  ca_fingerprint_ = *fp;
  // One token for every worker this cluster starts (it lives in the state file: a restarted
  // coordinator still takes it).
  if (join_token_.empty()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::CreateTokenRequest req;
    req.set_uses(10000);
    req.set_ttl_seconds(7 * 24 * 3600);
    v1::CreateTokenResponse resp;
    grpc::Status s = stub_->CreateToken(&ctx, req, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("cannot make a join token: ", s.error_message()));
    join_token_ = resp.token();
  }
  // For the test's own longhaulctl and longhaul-worker command lines (see the top of local_cluster.h).
  setenv("LONGHAUL_PKI_DIR", pki_dir().c_str(), 1);
  setenv("LONGHAUL_JOIN_TOKEN", join_token_.c_str(), 1);
  setenv("LONGHAUL_CA_FINGERPRINT", ca_fingerprint_.c_str(), 1);
  return absl::OkStatus();
}

std::vector<std::string> Cluster::WorkerSecurityFlags() const {
  if (insecure_) return {"--insecure"};
  return {absl::StrCat("--join-token=", join_token_), absl::StrCat("--ca-fingerprint=", ca_fingerprint_)};
}

absl::Status Cluster::RestartCoordinator() {
  coordinator_->Signal(SIGTERM);
  if (coordinator_->Wait(absl::Seconds(10)) != 0) return absl::InternalError("the coordinator did not exit cleanly");
  return StartCoordinator();
}

absl::Status Cluster::KillCoordinator() {
  coordinator_->Signal(SIGKILL);
  if (coordinator_->Wait(absl::Seconds(10)) < 0) return absl::InternalError("the coordinator did not die");
  return absl::OkStatus();
}

absl::Status Cluster::StartWorkers(int n) {
  const size_t before = workers_.size();
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("w", before + i);
    std::vector<std::string> argv = Prefix(name);
    argv.insert(argv.end(), {Bin("longhaul-worker"), absl::StrCat("--coordinator=", address_),
                             absl::StrCat("--listen=", Host(name), ":0"), absl::StrCat("--name=", name),
                             absl::StrCat("--threads=", threads_), absl::StrCat("--data-dir=", dir_, "/", name),
                             absl::StrCat("--metrics-listen=", Host(name), ":0")});
    if (!devices_.empty()) argv.push_back(absl::StrCat("--device=", devices_[(before + i) % devices_.size()]));
    if (!regions_.empty()) argv.push_back(absl::StrCat("--region=", regions_[(before + i) % regions_.size()]));
    for (const std::string& f : WorkerSecurityFlags()) argv.push_back(f);
    argv.insert(argv.end(), worker_flags_.begin(), worker_flags_.end());
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, absl::StrCat(dir_, "/", name, ".log"));
    if (!p.ok()) return p.status();
    workers_[name] = std::move(*p);
  }
  // Each new worker registered and alive (a pending or recovering job may take it at once).
  const absl::Time end = absl::Now() + absl::Seconds(60);
  for (;;) {
    absl::StatusOr<std::vector<v1::WorkerStatus>> ws = Workers();
    size_t up = 0;
    if (ws.ok()) {
      for (const auto& w : *ws) {
        const std::string& name = w.info().name();
        const bool mine = name.size() > 1 && name[0] == 'w' &&
                          static_cast<size_t>(std::atoi(name.c_str() + 1)) >= before && workers_.count(name);
        up += mine && w.state() != v1::WORKER_STATE_DEAD;
      }
      if (up >= static_cast<size_t>(n)) return absl::OkStatus();
    }
    if (absl::Now() > end) return absl::DeadlineExceededError(absl::StrCat("only ", up, " of ", n, " workers registered"));
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status Cluster::WaitForIdleWorkers(int n, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  int idle = 0;
  while (absl::Now() < end) {
    absl::StatusOr<std::vector<v1::WorkerStatus>> ws = Workers();
    idle = 0;
    if (ws.ok()) {
      for (const auto& w : *ws) idle += w.state() == v1::WORKER_STATE_IDLE;
      if (idle >= n) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("only ", idle, " of ", n, " workers idle"));
}

absl::StatusOr<std::vector<v1::WorkerStatus>> Cluster::Workers() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListWorkersResponse r;
  grpc::Status s = stub_->ListWorkers(&ctx, {}, &r);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return std::vector<v1::WorkerStatus>(r.workers().begin(), r.workers().end());
}

absl::StatusOr<uint64_t> Cluster::Submit(const std::string& yaml) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  v1::SubmitJobResponse resp;
  grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return resp.job_id();
}

absl::StatusOr<v1::JobStatus> Cluster::Get(uint64_t job, bool losses) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetJobRequest req;
  req.set_job_id(job);
  req.set_include_losses(losses);
  v1::JobStatus st;
  grpc::Status s = stub_->GetJob(&ctx, req, &st);
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return st;
}

absl::StatusOr<v1::JobStatus> Cluster::WaitForEnd(uint64_t job, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    absl::StatusOr<v1::JobStatus> st = Get(job);
    if (!st.ok()) return st.status();
    const v1::JobState s = st->state();
    if (s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED) return Get(job, true);
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job, " did not end within ", absl::FormatDuration(timeout)));
}

absl::StatusOr<v1::JobStatus> Cluster::WaitForStep(uint64_t job, int64_t step, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    absl::StatusOr<v1::JobStatus> st = Get(job);
    if (!st.ok()) return st.status();
    const bool active = st->state() == v1::JOB_STATE_RUNNING || st->state() == v1::JOB_STATE_PENDING;
    if (st->step() >= step || !active) return st;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job, " did not reach step ", step));
}

absl::StatusOr<std::string> Cluster::WorkerOf(uint64_t job, int stage) {
  absl::StatusOr<v1::JobStatus> st = Get(job);
  if (!st.ok()) return st.status();
  if (stage >= st->stages_size()) return absl::NotFoundError("stage not placed");
  return st->stages(stage).worker_name();
}

absl::StatusOr<std::string> Cluster::HttpGet(const std::string& host_port, const std::string& path,
                                             absl::Duration timeout) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("not host:port: ", host_port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string host = host_port.substr(0, colon);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (int rc = getaddrinfo(host.c_str(), host_port.substr(colon + 1).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat(host_port, ": ", gai_strerror(rc)));
  }
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  // absl::ToTimeval keeps the sub-second part (a zero timeval would mean "block forever").
  timeval tv = absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", host_port, ": ", why));
  }
  // HTTP/1.0: the server closes the connection after the answer, so reading to EOF gets all of it.
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot send to ", host_port));
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      return absl::UnavailableError(absl::StrCat("reading from ", host_port, path, ": ", why));
    }
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = resp.find("\r\n\r\n");
  if (end == std::string::npos) return absl::DataLossError(absl::StrCat(host_port, path, ": no HTTP header"));
  const std::string status_line = resp.substr(0, resp.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("GET ", host_port, path, ": ", status_line));
  }
  return resp.substr(end + 4);
}

std::pair<int, std::string> Cluster::Run(const std::string& cmd) {
  bp::ipstream out;
  std::error_code ec;
  bp::child c(bp::exe = "/bin/sh", bp::args = std::vector<std::string>{"-c", cmd}, (bp::std_out & bp::std_err) > out,
              ec);
  if (ec) return {-1, absl::StrCat("cannot run /bin/sh: ", ec.message())};
  std::string text{std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>()};
  c.wait(ec);
  const int status = c.native_exit_code();
  return {!ec && WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

void Cluster::DumpLogs() {
  // (Not std::filesystem's iterator, which breaks in binaries linking the PyTorch wheel: list_dir.h.)
  absl::StatusOr<std::vector<std::string>> files = common::ListRegularFiles(dir_);
  if (!files.ok()) return;
  for (const std::string& path : *files) {
    if (!absl::EndsWith(path, ".log")) continue;
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    std::fprintf(stderr, "===== %s =====\n%s\n", path.substr(path.rfind('/') + 1).c_str(), ss.str().c_str());
  }
}

}  // namespace longhaul::cluster
