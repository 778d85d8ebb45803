#include "tools/cluster/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace longhaul::cluster {

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  auto p = std::make_unique<Process>();
  const int rc = posix_spawn(&p->pid_, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return absl::InternalError(absl::StrCat("spawn ", argv[0], ": ", std::strerror(rc)));
  return p;
}

Process::~Process() {
  if (running()) {
    Signal(SIGKILL);
    Wait(absl::Seconds(5));
  }
}

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

bool Process::running() {
  if (reaped_) return false;
  int st;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return true;
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() > end) return -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

Cluster::Cluster(int threads) : threads_(threads) {
  char tmpl[] = "/tmp/longhaul-it-XXXXXX";
  dir_ = mkdtemp(tmpl);
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
  return {"/usr/sbin/ip", "netns", "exec", placement_.ns(role)};
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
                           "--heartbeat-timeout-ms=3000", "--heartbeat-interval-ms=300"});
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
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
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
