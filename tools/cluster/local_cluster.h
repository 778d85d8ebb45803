// A real cluster of separate processes on loopback — one longhaul-coordinator and N
// longhaul-worker daemons started from build/bin — plus a gRPC client to the coordinator. Used by
// the integration tests and by experiment runners (longhaul-bench sweep).
//
//   Cluster c;                       // temp dir, nothing started
//   ASSERT_TRUE(c.StartCoordinator().ok());
//   ASSERT_TRUE(c.StartWorkers(4).ok());
//   auto job = c.Submit(yaml);  auto st = c.WaitForEnd(*job, absl::Minutes(3));
//
// TLS (docs/security.md) unless SetInsecure(true): the coordinator makes its CA in
// <dir>/longhaul-pki, the cluster's stub uses the admin identity written there, and workers join
// with a join token the cluster makes at start-up (JoinToken(), CaFingerprint()). So that ad-hoc
// processes of a test find them too, StartCoordinator also sets LONGHAUL_PKI_DIR (longhaulctl),
// LONGHAUL_JOIN_TOKEN and LONGHAUL_CA_FINGERPRINT (longhaul-worker) in this process's environment.
//
// Every process's stdout/stderr goes to <dir>/<name>.log (a temporary directory, removed at the end
// unless LONGHAUL_KEEP_TEST_DIRS is set); DumpLogs() prints them.
#ifndef LONGHAUL_TOOLS_CLUSTER_LOCAL_CLUSTER_H_
#define LONGHAUL_TOOLS_CLUSTER_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "longhaul/v1/control_plane.grpc.pb.h"

namespace boost::process {
class child;
}  // namespace boost::process

namespace longhaul::cluster {

// A child process (on Boost.Process) with its stdout and stderr appended to a log file.
// Threading: Signal() may be called from any thread; the rest from one thread at a time.
class Process {
 public:
  // Starts `argv[0]` (a path; PATH is not searched) with its output appended to `log`.
  static absl::StatusOr<std::unique_ptr<Process>> Spawn(const std::vector<std::string>& argv, const std::string& log);
  explicit Process(std::unique_ptr<boost::process::child> child);
  ~Process();  // SIGKILL if still running
  // Sends `sig` unless the process has been reaped (its pid may belong to another one by then).
  void Signal(int sig);
  // Waits for exit; returns the exit code (128 + signal when killed), or -1 on timeout.
  int Wait(absl::Duration timeout);
  // Reaps the process once it has exited.
  bool running();
  pid_t pid() const;

 private:
  std::unique_ptr<boost::process::child> child_;
  std::atomic<bool> reaped_{false};
};

class Cluster {
 public:
  // `threads`: LibTorch threads per worker.
  explicit Cluster(int threads = 1);

  // Optional, before starting anything: run each process inside a network namespace (see
  // netem/tc/network.h). For a role ("coordinator", "w0", "w1", ...) `ns` gives the namespace and
  // `host` the address the process listens on. Without it everything runs on 127.0.0.1.
  struct Placement {
    std::function<std::string(const std::string& role)> ns, host;
  };
  void SetPlacement(Placement p) { placement_ = std::move(p); }
  // Optional, before StartWorkers: the --device each worker computes on (dealt round-robin, so
  // several workers may share one GPU); default cpu.
  void SetWorkerDevices(std::vector<std::string> devices) { devices_ = std::move(devices); }
  // Optional, before StartWorkers: the --region of each worker (dealt round-robin, so {"a", "b"}
  // puts workers 0, 2, ... in a and 1, 3, ... in b); default the worker's own (local).
  void SetWorkerRegions(std::vector<std::string> regions) { regions_ = std::move(regions); }
  // Optional, before StartCoordinator: more longhaul-coordinator flags (e.g. "--reserve-after=1s";
  // not --listen, --port-file, --state or the heartbeat flags, which the cluster sets); kept for
  // restarts.
  void SetCoordinatorFlags(std::vector<std::string> flags) { coordinator_flags_ = std::move(flags); }
  // Optional, before StartWorkers: more longhaul-worker flags (e.g. "--allow-paths=DIR"; not those
  // the cluster sets: --coordinator, --listen, --name, --data-dir, --device, security).
  void SetWorkerFlags(std::vector<std::string> flags) { worker_flags_ = std::move(flags); }
  // Before StartCoordinator: plaintext with --insecure everywhere (loopback only) instead of TLS.
  void SetInsecure(bool insecure) { insecure_ = insecure; }
  bool insecure() const { return insecure_; }
  // TLS: the coordinator's --pki-dir (ca.crt, admin.crt, admin.key), a join token good for many
  // workers, and the CA's fingerprint.
  std::string pki_dir() const { return dir_ + "/longhaul-pki"; }
  const std::string& join_token() const { return join_token_; }
  const std::string& ca_fingerprint() const { return ca_fingerprint_; }
  // The flags a longhaul-worker of this cluster needs (--join-token and --ca-fingerprint, or --insecure).
  std::vector<std::string> WorkerSecurityFlags() const;
  ~Cluster();

  absl::Status StartCoordinator();
  // Stops (SIGTERM) and restarts the coordinator on the same state file; returns the new address.
  absl::Status RestartCoordinator();
  // SIGKILLs the coordinator (StartCoordinator starts it again on the same address and state file).
  absl::Status KillCoordinator();
  // Starts workers named w<i> (numbered on from those started before) and waits until each has
  // registered (idle, or already given a stage).
  absl::Status StartWorkers(int n);
  absl::Status WaitForIdleWorkers(int n, absl::Duration timeout);

  v1::Coordinator::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }
  // host:port of the coordinator's Prometheus endpoint (/metrics, /sd). Every daemon of the
  // cluster serves metrics on a free port; a worker's address is in its WorkerInfo.metrics_address.
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& dir() const { return dir_; }
  Process* worker(const std::string& name) { return workers_.at(name).get(); }
  Process* coordinator() { return coordinator_.get(); }

  absl::StatusOr<uint64_t> Submit(const std::string& yaml);
  absl::StatusOr<v1::JobStatus> Get(uint64_t job, bool losses = false);
  absl::StatusOr<v1::JobStatus> WaitForEnd(uint64_t job, absl::Duration timeout);
  absl::StatusOr<v1::JobStatus> WaitForStep(uint64_t job, int64_t step, absl::Duration timeout);
  absl::StatusOr<std::vector<v1::WorkerStatus>> Workers();
  // Name of the worker hosting `stage` of `job`.
  absl::StatusOr<std::string> WorkerOf(uint64_t job, int stage);

  // A plain HTTP/1.0 GET of http://<host_port><path> (a blocking socket; for the metrics endpoints):
  // the body of a 200 answer, an error otherwise.
  static absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                             absl::Duration timeout = absl::Seconds(10));
  // Runs a command line, returns (exit code, combined output).
  static std::pair<int, std::string> Run(const std::string& cmd);
  static std::string Bin(const std::string& name);
  void DumpLogs();
  // Sends `sig` to every process of the cluster (for a tool's own termination handler; safe to call
  // from another thread once the processes are started).
  void SignalAll(int sig);

 private:
  absl::Status Connect();
  std::string dir_;
  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  int threads_ = 1;
  Placement placement_;
  std::vector<std::string> devices_;
  std::vector<std::string> regions_;
  std::vector<std::string> coordinator_flags_;
  std::vector<std::string> worker_flags_;
  bool insecure_ = false;
  std::string join_token_, ca_fingerprint_;
  std::vector<std::string> Prefix(const std::string& role) const;
  std::string Host(const std::string& role) const;
};

}  // namespace longhaul::cluster

#endif  // LONGHAUL_TOOLS_CLUSTER_LOCAL_CLUSTER_H_
