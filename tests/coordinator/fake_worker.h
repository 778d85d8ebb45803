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
// Threading: one reader thread fills the message list; the methods may be called from any thread.
#ifndef LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_
#define LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_TESTS_COORDINATOR_FAKE_WORKER_H_
