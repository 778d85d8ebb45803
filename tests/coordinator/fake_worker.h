// Support for the coordinator service's tests: a state file name, the service served on loopback,
// and a worker as the coordinator sees it (registered over gRPC, its Session stream open and bound
// by a first heartbeat, keeping every message the coordinator sends it).
//
//   const std::string state = TempStatePath("longhaul-links");   ...   RemoveStateFiles(state);
//   std::unique_ptr<grpc::Server> server = ServeOnLoopback(service.get(), &stub);
//
//   FakeSession w(stub, Registration("a"));
//   w.Send(message);                               // returns once the coordinator has handled it
//   w.WaitFor([](const v1::CoordinatorMessage& c) { return c.has_assign(); });
//
// FakeStage is a worker that reports as a stage would (steps, checkpoints, copies, its end, what
// it is doing); ServiceFixture runs the service with a fake clock and keeps named FakeStages
// (the recovery and watchdog tests).
//
// Threading: one reader thread fills the message list; the methods may be called from any thread.
#ifndef LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_
#define LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "longhaul/v1/control_plane.grpc.pb.h"

namespace longhaul::coordinator {

// A fresh name for a coordinator state file under /tmp (nothing is created there).
inline std::string TempStatePath(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  const int fd = mkstemp(tmpl.data());
  if (fd >= 0) close(fd);
  std::remove(tmpl.c_str());
  return tmpl;
}

// The state file and what SQLite and the coordinator's lock put next to it.
inline void RemoveStateFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
}

// `service` served on a free loopback port; *stub is a client of it. The server must be shut down
// before the service goes away.
inline std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service,
                                                     std::unique_ptr<v1::Coordinator::Stub>* stub) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  EXPECT_TRUE(server && port > 0);
  *stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  return server;
}

// A registration with `name` and a placeholder data-plane address.
inline v1::RegisterRequest Registration(const std::string& name, const std::string& address = "127.0.0.1:9") {
  v1::RegisterRequest req;
  req.mutable_info()->set_name(name);
  req.mutable_info()->set_address(address);
  return req;
}

class FakeSession {
 public:
  FakeSession(v1::Coordinator::Stub& stub, const v1::RegisterRequest& req) {
    v1::RegisterResponse resp;
    grpc::ClientContext rc;
    EXPECT_TRUE(stub.Register(&rc, req, &resp).ok());
    id_ = resp.worker_id();
    stream_ = stub.Session(&ctx_);
    reader_ = std::thread([this] {
      v1::CoordinatorMessage m;
      while (stream_->Read(&m)) {
        absl::MutexLock l(&mu_);
        got_.push_back(m);
      }
    });
    v1::WorkerMessage hello;  // the first message binds the stream to the worker id
    hello.set_worker_id(id_);
    hello.mutable_heartbeat();
    EXPECT_TRUE(stream_->Write(hello));
    Ping();  // the session is bound once the coordinator answers
  }
  virtual ~FakeSession() {
    ctx_.TryCancel();
    reader_.join();
    (void)stream_->Finish();
  }
  FakeSession(const FakeSession&) = delete;
  FakeSession& operator=(const FakeSession&) = delete;

  uint64_t id() const { return id_; }

  // Sends `m` (as this worker) without waiting.
  void Post(v1::WorkerMessage m) {
    m.set_worker_id(id_);
    ASSERT_TRUE(stream_->Write(m));
  }
  // Sends `m` and waits until the coordinator has handled it.
  void Send(v1::WorkerMessage m) {
    Post(std::move(m));
    Ping();
  }
  // A heartbeat naming a job the coordinator does not run here: it answers with a cancellation,
  // which shows the heartbeat (and everything sent before it) has been handled.
  void Ping() {
    const uint64_t bogus = 1000000 + pings_++;
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_running_job_id(bogus);
    Post(m);
    ASSERT_TRUE(WaitFor([&](const v1::CoordinatorMessage& c) { return c.has_cancel() && c.cancel().job_id() == bogus; },
                        absl::Seconds(10)))
        << "no answer to a ping";
  }
  // Whether the messages received so far satisfy `done`, waiting up to `timeout` for them to.
  bool WaitUntil(const std::function<bool(const std::vector<v1::CoordinatorMessage>&)>& done,
                 absl::Duration timeout = absl::Seconds(5)) {
    absl::MutexLock l(&mu_);
    auto met = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done(got_); };
    return mu_.AwaitWithTimeout(absl::Condition(&met), timeout);
  }
  // Whether a message matching `match` has arrived, waiting up to `timeout` for one.
  bool WaitFor(const std::function<bool(const v1::CoordinatorMessage&)>& match,
               absl::Duration timeout = absl::Seconds(5)) {
    return WaitUntil(
        [&](const std::vector<v1::CoordinatorMessage>& got) {
          for (const auto& c : got) {
            if (match(c)) return true;
          }
          return false;
        },
        timeout);
  }
  // Every message received so far, oldest first.
  std::vector<v1::CoordinatorMessage> Received() {
    absl::MutexLock l(&mu_);
    return got_;
  }

 private:
  uint64_t id_ = 0;
  int pings_ = 0;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> got_ ABSL_GUARDED_BY(mu_);
};

// A worker as the coordinator sees it running stages, keeping every message it is sent.
class FakeStage : public FakeSession {
 public:
  // `running`: the stage it says it runs when it registers (after a coordinator restart, or after
  // it was declared dead); `gflops`: the compute speed it reports (0: none).
  FakeStage(v1::Coordinator::Stub& stub, const std::string& name, const v1::RunningStage* running = nullptr,
            double gflops = 0)
      : FakeSession(stub, Request(name, running, gflops)) {}

  void Heartbeat(uint64_t job, int attempt) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_running_job_id(job);
    m.mutable_heartbeat()->set_running_attempt(attempt);
    Send(m);
  }
  // A heartbeat saying what its stage does (StageActivity), as the worker's heartbeats do.
  void Doing(uint64_t job, int attempt, v1::StageActivity::Phase phase, int64_t step, int peer = -1,
             double seconds = 0) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_running_job_id(job);
    m.mutable_heartbeat()->set_running_attempt(attempt);
    v1::StageActivity* a = m.mutable_heartbeat()->mutable_activity();
    a->set_phase(phase);
    a->set_step(step);
    a->set_peer_stage(peer);
    a->set_seconds(seconds);
    Send(m);
  }
  // A heartbeat with nothing running.
  void Idle() {
    v1::WorkerMessage m;
    m.mutable_heartbeat();
    Send(m);
  }
  void Progress(uint64_t job, int stage, int64_t step, int attempt, bool checkpointed = false) {
    v1::StepProgress p;
    p.set_checkpointed(checkpointed);
    Report(job, stage, step, attempt, p);
  }
  // A step report with `p`'s timings (and the job, stage, step and attempt given).
  void Report(uint64_t job, int stage, int64_t step, int attempt, v1::StepProgress p) {
    v1::WorkerMessage m;
    p.set_job_id(job);
    p.set_stage(stage);
    p.set_step(step);
    p.set_attempt(attempt);
    p.set_loss(5.0 - 0.01 * static_cast<double>(step));
    *m.mutable_progress() = p;
    Send(m);
  }
  void Replicated(uint64_t job, int stage, int64_t step, int attempt, uint64_t to) {
    v1::WorkerMessage m;
    v1::CheckpointReplicated* r = m.mutable_replicated();
    r->set_job_id(job);
    r->set_stage(stage);
    r->set_step(step);
    r->set_attempt(attempt);
    r->set_replica_worker_id(to);
    Send(m);
  }
  // The end of its stage; `ok` ends it at the planned step, which it reports first as the real
  // worker does (the coordinator takes a stage that says it finished before that step as failed).
  void Finished(uint64_t job, int stage, int attempt, bool ok, bool retryable = true, const std::string& error = "") {
    if (ok) {
      if (std::optional<v1::StageAssignment> a = Assigned(job, attempt)) Progress(job, stage, a->spec().steps(), attempt);
    }
    SaysFinished(job, stage, attempt, ok, retryable, error);
  }
  // Only the JobFinished message, whatever step the stage reached (a lying or broken worker).
  void SaysFinished(uint64_t job, int stage, int attempt, bool ok, bool retryable = true, const std::string& error = "") {
    v1::WorkerMessage m;
    v1::JobFinished* f = m.mutable_finished();
    f->set_job_id(job);
    f->set_stage(stage);
    f->set_attempt(attempt);
    f->set_ok(ok);
    f->set_retryable(retryable);
    f->set_error(error);
    Send(m);
  }

  // The last assignment of `job` with at least `attempt`, waiting a few seconds for it.
  std::optional<v1::StageAssignment> Assigned(uint64_t job, int attempt) {
    std::optional<v1::StageAssignment> a;
    WaitFor([&](const v1::CoordinatorMessage& c) {
      if (c.has_assign() && c.assign().job_id() == job && c.assign().attempt() >= attempt) a = c.assign();
      return a.has_value();
    });
    return a;
  }
  bool Cancelled(uint64_t job, int attempt) {
    return WaitFor([&](const v1::CoordinatorMessage& c) {
      return c.has_cancel() && c.cancel().job_id() == job && c.cancel().attempt() == attempt;
    });
  }
  bool GotFloor(uint64_t job, int64_t step) {
    return WaitFor([&](const v1::CoordinatorMessage& c) {
      return c.has_checkpoint_floor() && c.checkpoint_floor().job_id() == job && c.checkpoint_floor().step() == step;
    });
  }

 private:
  static v1::RegisterRequest Request(const std::string& name, const v1::RunningStage* running, double gflops) {
    v1::RegisterRequest req = Registration(name, absl::StrCat(name, ":1"));
    req.mutable_info()->set_compute_gflops(gflops);
    if (running != nullptr) *req.mutable_running() = *running;
    return req;
  }
};

// The service on loopback with a fake clock (heartbeat timeout 10 s, reattach grace 20 s, stop
// timeout 30 s) and named FakeStages.
class ServiceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempStatePath("longhaul-recovery");
    Start();
  }
  void TearDown() override {
    StopService();
    RemoveStateFiles(path_);
  }
  void Start() {
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(10);
    o.reattach_grace = absl::Seconds(20);
    o.stop_timeout = absl::Seconds(30);
    o.clock = &clock_;
    auto svc = CoordinatorService::Create(std::move(*store), o);
    ASSERT_TRUE(svc.ok()) << svc.status();
    svc_ = std::move(*svc);
    server_ = ServeOnLoopback(svc_.get(), &stub_);
    ASSERT_NE(server_, nullptr);
  }
  // As a coordinator going away: its sessions end first (the workers are not lost), then the fakes.
  void StopService() {
    if (svc_) svc_->Stop();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    workers_.clear();
    server_.reset();
    svc_.reset();
  }
  FakeStage& Add(const std::string& name, const v1::RunningStage* running = nullptr, double gflops = 0) {
    workers_[name] = std::make_unique<FakeStage>(*stub_, name, running, gflops);
    return *workers_[name];
  }
  // Waits until the service has declared `name` dead.
  void AwaitDead(const std::string& name) {
    for (int i = 0; i < 500; ++i) {
      if (StateOf(name) == v1::WORKER_STATE_DEAD) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << name << " was not declared dead";
  }
  void Kill(const std::string& name) {
    workers_.erase(name);  // its session closes; the service notices on its own thread
    AwaitDead(name);
  }
  // Time passes; the live fakes keep their heartbeats up.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    for (auto& [name, w] : workers_) w->Ping();
    svc_->CheckHeartbeats();
  }
  uint64_t Submit(int stages, const std::string& extra = "") {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(absl::StrCat("name: r\nstages: ", stages, "\nmodel: {layers: 4}\nsteps: 100\n", extra));
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
    return resp.job_id();
  }
  v1::JobStatus Job(uint64_t id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::JobStatus st;
    EXPECT_TRUE(svc_->GetJob(nullptr, &req, &st).ok());
    return st;
  }
  v1::WorkerStatus Worker(const std::string& name) {
    v1::ListWorkersResponse r;
    EXPECT_TRUE(svc_->ListWorkers(nullptr, nullptr, &r).ok());
    for (const auto& w : r.workers()) {
      if (w.info().name() == name) return w;
    }
    return {};
  }
  v1::WorkerState StateOf(const std::string& name) { return Worker(name).state(); }

  common::FakeClock clock_{absl::UnixEpoch() + absl::Hours(1000)};
  std::string path_;
  std::unique_ptr<CoordinatorService> svc_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<std::string, std::unique_ptr<FakeStage>> workers_;
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_
