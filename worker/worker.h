// The worker daemon's core: a StageLink server for incoming frames, a Session with the coordinator
// (register, heartbeats, progress up; assignments and cancellations down), and at most one running
// stage (StageRunner) at a time.
//
//   auto w = Worker::Start({.coordinator = "localhost:7400", .listen = "0.0.0.0:0", .name = "w0"});
//   std::thread signals([&] { WaitForSignal(); (*w)->Shutdown(); });
//   (*w)->Run();   // returns after Shutdown()
//
// Recovery (docs/recovery.md): it serves the CheckpointStore (checkpoint_store.h) next to the
// StageLink service, holding the copies of other stages' checkpoints; when it loses the
// coordinator it keeps its stage running, registers again naming it (RegisterRequest.running),
// and delivers a JobFinished it could not send before.
//
// For placement (coordinator/placement.h) it measures its device's compute speed at start-up
// (compute_bench.h) and serves a link probe sink (netem/tcp_probe.h) that the other workers probe;
// its own prober (link_prober.h) measures its links to the peers the coordinator names and reports
// each probe up the session.
//
// Threading: Run() is the session thread (reads the coordinator's stream). A heartbeat thread
// writes heartbeats; the job thread runs the StageRunner (the compute thread) and writes progress;
// the probe sink serves on a thread of its own and the prober has one (it writes its reports).
// A stage's checkpoint replicator has a thread of its own (it writes its reports). Writes to the
// session stream are serialised by write_mu_; what a coordinator that went away may have missed
// (progress, the end of a stage) is kept under progress_mu_, which the job thread holds while it
// sends one of those — never mu_, so a slow session write does not stall the data plane's inbox
// lookups, cancellations or the heartbeats. Lock order: mu_, progress_mu_, write_mu_. gRPC's
// threads run the StageLink handlers (callback API) and the CheckpointStore's (sync API).
// Shutdown() may be called from any thread, more than once (later calls wait for the first).
#ifndef LONGHAUL_WORKER_WORKER_H_
#define LONGHAUL_WORKER_WORKER_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/throttled_log.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "netem/tcp_probe.h"
#include "security/pki.h"
#include "worker/checkpoint_store.h"
#include "worker/link_prober.h"
#include "worker/link_service.h"
#include "worker/stage_runner.h"
#include "worker/worker_metrics.h"

namespace longhaul::worker {

struct WorkerOptions {
  std::string coordinator = "localhost:7400";
  std::string listen = "0.0.0.0:0";  // port 0: pick a free port
  std::string advertise_host = "";   // host others use to reach us; "" = the listen host, or 127.0.0.1 for 0.0.0.0
  std::string name;                  // "" = hostname-port
  std::string region = "local";
  std::string device = "cpu";        // cpu, cuda, cuda:N (stage_runtime::ParseDevice)
  std::string data_dir = "/tmp/longhaul-worker";
  // Directories besides data_dir that a job spec's checkpoint.dir and data.corpus may name
  // (worker/spec_paths.h).
  std::vector<std::string> allow_paths;
  // Prometheus /metrics (docs/observability.md): HOST:PORT, port 0 for a free one, "none" for off.
  std::string metrics_listen = "none";
  // When metrics_listen cannot be served (the default port taken by another worker on this host),
  // serve on a free port instead of failing.
  bool metrics_fallback = false;
  // The link probe sink others measure their links to this worker with: HOST:PORT (port 0: a free
  // one), "" for the --listen host on a free port, "none" for no sink and no probing.
  std::string probe_listen = "";
  ProbeSettings probe;              // this worker's probes of its peers (link_prober.h)
  bool measure_compute = true;      // run the compute benchmark at start-up (compute_bench.h)
  // Largest checkpoint this worker takes as a replica from another, or fetches to restore one.
  int64_t replica_max_bytes = kDefaultReplicaMaxBytes;
  // TLS (docs/security.md; worker/identity.h): the cluster CA and this worker's certificate, for
  // its server (client certificates required), its channel to the coordinator and the data plane's
  // channels. Unset (--insecure): plaintext.
  std::optional<std::pair<std::string, security::KeyAndCert>> tls;  // (CA PEM, own key and certificate)
  // TEST HOOK only (LONGHAUL_TEST_HANG_AT_STEP, read once by worker/main.cc): a stage that hangs.
  TestHang test_hang;
};

class Worker : public InboxRouter {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& o);
  ~Worker() override;

  // The session loop: registers, serves the coordinator's stream, reconnects (with backoff) when
  // the coordinator goes away. Returns after Shutdown().
  void Run();
  // Stops the running job (it is reported as failed), closes the session and the server. Any
  // thread; a second call waits for the first to finish.
  void Shutdown();

  const std::string& address() const { return address_; }
  // host:port of the /metrics endpoint, "" when metrics are off.
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& name() const { return opt_.name; }
  // host:port of the link probe sink, "" when probing is off.
  const std::string& probe_address() const { return probe_address_; }

  absl::StatusOr<std::shared_ptr<Inbox>> Find(uint64_t job_id, int attempt, int from_stage, int from_replica,
                                              absl::Duration wait) override;
  absl::Status CheckSender(uint64_t job_id, int from_stage, int from_replica, const std::string& sender) override;

 private:
  Worker(const WorkerOptions& o, torch::Device device) : opt_(o), device_(device) {}
  bool RunSession();  // one registration + session; false when the coordinator was unreachable
  void StartJob(const v1::StageAssignment& a);
  void CancelJob(uint64_t job_id, int attempt, const std::string& reason);
  void OnFloor(const v1::CheckpointFloor& f);
  // The checkpoint of (job, stage, replica, step) this worker wrote itself, or ""
  // (CheckpointStore.Get).
  std::string LocateOwnCheckpoint(uint64_t job_id, int stage, int replica, int64_t step);
  void JoinFinishedJob();
  bool Send(const v1::WorkerMessage& m);
  // Starts the probe sink and the prober (after the server: the sink's host is the advertised one).
  absl::Status StartProbing(const std::string& host);
  void StopProbing();  // idempotent

  WorkerOptions opt_;
  common::ThrottledLog refusals_{"worker"};  // data-plane streams refused (CheckSender), per sender
  const torch::Device device_;  // where stages compute (opt_.device, parsed)
  std::string address_;
  std::string metrics_address_;
  double compute_gflops_ = 0;  // 0: not measured
  std::string probe_address_;
  std::unique_ptr<netem::TcpSink> probe_sink_;
  std::thread probe_sink_thread_;
  std::unique_ptr<LinkProber> prober_;
  // Before the server, which serves their registry until it is destroyed (the job thread updates them).
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<common::MetricsServer> metrics_server_;
  std::unique_ptr<StageLinkService> link_service_;
  std::unique_ptr<CheckpointStoreService> checkpoint_store_;
  // Replicated stages' synchronisation among replicas (worker/replica_sync.h).
  std::unique_ptr<collective::CollectiveService> collective_service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> coord_channel_;
  std::unique_ptr<v1::Coordinator::Stub> coord_;

  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_done_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown() has finished
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::shared_ptr<StageRunner> job_ ABSL_GUARDED_BY(mu_);
  std::thread job_thread_ ABSL_GUARDED_BY(mu_);
  bool job_done_ ABSL_GUARDED_BY(mu_) = false;
  // Where this worker's stage of each job keeps its checkpoints, and which replica it ran (for
  // CheckpointStore.Get; a worker runs one slot of a job at a time).
  struct OwnCheckpoints {
    std::string dir;
    int replica = 0;
  };
  std::map<uint64_t, OwnCheckpoints> checkpoint_dirs_ ABSL_GUARDED_BY(mu_);

  // What a coordinator that went away may have missed (docs/recovery.md), sent again on the next
  // session: the end of the last job (until another starts; a repeat is harmless), the progress
  // reports made while there was no session (the newest kMaxUnsentProgress), and the last few
  // sent before the session broke (written to the stream is not yet read by the coordinator).
  // A message is sent and, failing that, kept under progress_mu_, and a new session is published
  // and sent what was kept under it too: none falls between the two.
  absl::Mutex progress_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::optional<v1::WorkerMessage> last_finished_ ABSL_GUARDED_BY(progress_mu_);
  static constexpr size_t kMaxUnsentProgress = 100000;
  std::deque<v1::WorkerMessage> unsent_progress_ ABSL_GUARDED_BY(progress_mu_);
  static constexpr size_t kRecentProgress = 16;
  std::deque<v1::WorkerMessage> recent_progress_ ABSL_GUARDED_BY(progress_mu_);

  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_, progress_mu_);
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* session_ ABSL_GUARDED_BY(write_mu_) = nullptr;
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_WORKER_H_
