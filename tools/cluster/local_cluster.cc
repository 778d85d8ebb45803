#include "tools/cluster/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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
  if (!std::getenv("LONGHAUL_KEEP_TEST_DIRS")) std::filesystem::remove_all(dir_);
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
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = Prefix("coordinator");
  argv.insert(argv.end(), {Bin("longhaul-coordinator"),
                           // A restart reuses the port, so running workers find the new coordinator.
                           address_.empty() ? absl::StrCat("--listen=", Host("coordinator"), ":0")
                                            : absl::StrCat("--listen=", address_),
                           absl::StrCat("--port-file=", port_file), absl::StrCat("--state=", dir_, "/coordinator.db"),
                           "--heartbeat-timeout=3s", "--heartbeat-interval=300ms"});
  argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, absl::StrCat(dir_, "/coordinator.log"));
  if (!p.ok()) return p.status();
  coordinator_ = std::move(*p);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  for (;;) {
    std::ifstream f(port_file);
    int port = 0;
    if (f >> port && port > 0) {
      address_ = absl::StrCat(Host("coordinator"), ":", port);
      return Connect();
    }
    if (!coordinator_->running()) return absl::InternalError("the coordinator exited at start-up");
    if (absl::Now() > end) return absl::DeadlineExceededError("the coordinator did not start");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Cluster::Connect() {
  stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

absl::Status Cluster::RestartCoordinator() {
  coordinator_->Signal(SIGTERM);
  if (coordinator_->Wait(absl::Seconds(10)) != 0) return absl::InternalError("the coordinator did not exit cleanly");
  return StartCoordinator();
}

absl::Status Cluster::StartWorkers(int n) {
  const size_t before = workers_.size();
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("w", before + i);
    std::vector<std::string> argv = Prefix(name);
    argv.insert(argv.end(), {Bin("longhaul-worker"), absl::StrCat("--coordinator=", address_),
                             absl::StrCat("--listen=", Host(name), ":0"), absl::StrCat("--name=", name),
                             absl::StrCat("--threads=", threads_), absl::StrCat("--data-dir=", dir_, "/", name)});
    if (!devices_.empty()) argv.push_back(absl::StrCat("--device=", devices_[(before + i) % devices_.size()]));
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, absl::StrCat(dir_, "/", name, ".log"));
    if (!p.ok()) return p.status();
    workers_[name] = std::move(*p);
  }
  return WaitForIdleWorkers(static_cast<int>(workers_.size()), absl::Seconds(60));
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
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    if (e.path().extension() != ".log") continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    std::fprintf(stderr, "===== %s =====\n%s\n", e.path().filename().c_str(), ss.str().c_str());
  }
}

}  // namespace longhaul::cluster
