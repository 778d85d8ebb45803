#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "proto/replica_layout.h"
#include "security/tls.h"
#include "worker/compute_bench.h"

namespace longhaul::worker {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& o) {
  absl::StatusOr<torch::Device> device = stage_runtime::ParseDevice(o.device);
  if (!device.ok()) return device.status();
  std::unique_ptr<Worker> w(new Worker(o, *device));
  std::error_code ec;
  std::filesystem::create_directories(o.data_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--data-dir ", o.data_dir, ": ", ec.message()));

  // Before any channel or server exists: the data plane's senders take their credentials from here.
  if (o.tls) security::SetDataPlaneIdentity(o.tls->first, o.tls->second);
  w->link_service_ = std::make_unique<StageLinkService>(w.get());
  w->checkpoint_store_ = std::make_unique<CheckpointStoreService>(
      CheckpointStoreOptions{o.data_dir, o.replica_max_bytes},
      [p = w.get()](uint64_t job, int stage, int replica, int64_t step) {
        return p->LocateOwnCheckpoint(job, stage, replica, step);
      });
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(o.listen, security::DataPlaneServerCredentials(), &port);
  ConfigureLonghaulServer(&b);
  // The CheckpointStore's methods are registered; every other method goes to the generic StageLink
  // service (which refuses all but its own).
  b.RegisterService(w->checkpoint_store_.get());
  w->collective_service_ = std::make_unique<collective::CollectiveService>();
  b.RegisterService(w->collective_service_.get());
  b.RegisterCallbackGenericService(w->link_service_.get());
  w->server_ = b.BuildAndStart();
  if (!w->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen, " (address in use or invalid?)"));
  }
  std::string host = o.advertise_host;
  if (host.empty()) {
    const size_t colon = o.listen.rfind(':');
    host = colon == std::string::npos ? o.listen : o.listen.substr(0, colon);
    if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  }
  w->address_ = absl::StrCat(host, ":", port);
  if (w->opt_.name.empty()) {
    char hn[256] = {0};
    gethostname(hn, sizeof(hn) - 1);
    w->opt_.name = absl::StrCat(hn, "-", port);
  }
  std::string note;
  absl::StatusOr<std::unique_ptr<common::MetricsServer>> ms =
      common::StartMetricsServer(o.metrics_listen, o.metrics_fallback, &note);
  if (!ms.ok()) return absl::Status(ms.status().code(), absl::StrCat("--metrics-listen: ", ms.status().message()));
  if (*ms) {
    w->metrics_ = std::make_unique<WorkerMetrics>(*common::MetricsRegistry());
    w->metrics_server_ = std::move(*ms);
    w->metrics_address_ = common::AdvertisedAddress(o.metrics_listen, w->metrics_server_->port(), o.advertise_host);
  }
  if (o.measure_compute) {
    absl::StatusOr<double> gflops = MeasureComputeGflops(*device);
    if (gflops.ok()) {
      w->compute_gflops_ = *gflops;
    } else {
      common::Log(absl::StrCat("worker ", w->opt_.name), absl::StrCat("no compute speed: ", gflops.status().message()));
    }
  }
  if (absl::Status s = w->StartProbing(host); !s.ok()) return s;
  grpc::ChannelArguments coord_args = LonghaulChannelArgs();
  // A restarted coordinator is found within a couple of seconds, not after gRPC's reconnect backoff
  // has grown to minutes (docs/recovery.md).
  coord_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  coord_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  coord_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  w->coord_channel_ =
      o.tls ? security::SecureChannel(o.coordinator, security::ChannelCredentials(o.tls->first, &o.tls->second),
                                      security::kCoordinatorServerName, coord_args)
            : grpc::CreateCustomChannel(o.coordinator, grpc::InsecureChannelCredentials(), coord_args);
  w->coord_ = v1::Coordinator::NewStub(w->coord_channel_);
  common::Log(absl::StrCat("worker ", w->opt_.name),
              absl::StrCat("listening on ", w->address_, ", coordinator ", o.coordinator,
                           w->metrics_address_.empty() ? "" : absl::StrCat(", metrics on ", w->metrics_address_),
                           w->probe_address_.empty() ? "" : absl::StrCat(", link probes on ", w->probe_address_),
                           absl::StrFormat(", compute %.1f GFLOP/s", w->compute_gflops_)));
  if (!note.empty()) common::Log(absl::StrCat("worker ", w->opt_.name), note);
  return w;
}

Worker::~Worker() {
  Shutdown();
  StopProbing();
  JoinFinishedJob();
}

absl::Status Worker::StartProbing(const std::string& host) {
  if (opt_.probe_listen == "none") return absl::OkStatus();
  std::string listen = opt_.probe_listen;
  if (listen.empty()) {
    const size_t colon = opt_.listen.rfind(':');
    listen = absl::StrCat(colon == std::string::npos ? "" : opt_.listen.substr(0, colon), ":0");
  }
  // The sink takes an IPv4 address: a name is resolved, anything else (empty, IPv6) is every
  // interface.
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--probe-listen ", opt_.probe_listen, ": want HOST:PORT or none"));
  }
  std::string ip = "0.0.0.0";
  if (colon > 0) {
    absl::StatusOr<std::pair<std::string, int>> r = ResolveProbeAddress(absl::StrCat(listen.substr(0, colon), ":1"));
    if (r.ok()) ip = r->first;
  }
  absl::StatusOr<netem::TcpSink> sink = netem::TcpSink::Listen(ip, port, opt_.probe.max_probe_bytes);
  if (!sink.ok()) return absl::Status(sink.status().code(), absl::StrCat("--probe-listen: ", sink.status().message()));
  probe_sink_ = std::make_unique<netem::TcpSink>(std::move(*sink));
  probe_address_ = absl::StrCat(host, ":", probe_sink_->port());
  const std::string who = absl::StrCat("worker ", opt_.name);
  prober_ = std::make_unique<LinkProber>(
      opt_.probe,
      [this, who](const LinkProber::Peer& peer, const v1::LinkReport& r) {
        v1::WorkerMessage m;
        {
          absl::MutexLock l(&mu_);
          m.set_worker_id(worker_id_);
        }
        if (r.error().empty()) {
          common::Log(who, absl::StrFormat("link to %s: %.1f Mbit/s, RTT %.3f ms (probe of %d bytes)", peer.name,
                                           r.mbit_per_s(), r.rtt_ms(), r.bytes()));
        } else {
          common::Log(who, absl::StrCat("probe of ", peer.name, " (", peer.address, ") failed: ", r.error()));
        }
        *m.mutable_link() = r;
        Send(m);
      },
      [this] {
        absl::MutexLock l(&mu_);
        return job_ != nullptr && !job_done_;
      });
  // Two workers do not probe each other at once: the sink refuses the host being probed.
  probe_sink_->SetBusy([p = prober_.get()](const std::string& ip) { return p->ProbingHost(ip); });
  probe_sink_thread_ = std::thread([sink = probe_sink_.get()] { sink->Serve(); });
  return absl::OkStatus();
}

void Worker::StopProbing() {
  if (prober_) prober_->Stop();
  if (probe_sink_) probe_sink_->Stop();
  if (probe_sink_thread_.joinable()) probe_sink_thread_.join();
}

bool Worker::Send(const v1::WorkerMessage& m) {
  absl::MutexLock l(&write_mu_);
  return session_ != nullptr && session_->Write(m);
}

void Worker::Run() {
  const std::string who = absl::StrCat("worker ", opt_.name);
  absl::Duration backoff = absl::Milliseconds(200);
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (shutdown_) break;
    }
    if (RunSession()) backoff = absl::Milliseconds(200);
    absl::MutexLock l(&mu_);
    if (shutdown_) break;
    mu_.AwaitWithTimeout(absl::Condition(&shutdown_), backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  JoinFinishedJob();
  common::Log(who, "stopped");
}

bool Worker::RunSession() {
  const std::string who = absl::StrCat("worker ", opt_.name);
  v1::RegisterRequest req;
  req.mutable_info()->set_name(opt_.name);
  req.mutable_info()->set_address(address_);
  req.mutable_info()->set_region(opt_.region);
  req.mutable_info()->set_device(opt_.device);
  req.mutable_info()->set_metrics_address(metrics_address_);
  req.mutable_info()->set_probe_address(probe_address_);
  req.mutable_info()->set_compute_gflops(compute_gflops_);
  {
    // A stage still running (or ended while the coordinator was away) is named, so that a
    // restarted coordinator re-attaches it to its job.
    absl::MutexLock l(&mu_);
    absl::MutexLock p(&progress_mu_);
    if (job_) {
      req.mutable_running()->set_job_id(job_->job_id());
      req.mutable_running()->set_stage(job_->stage());
      req.mutable_running()->set_attempt(job_->attempt());
      req.mutable_running()->set_replica(job_->replica());
    } else if (last_finished_) {
      req.mutable_running()->set_job_id(last_finished_->finished().job_id());
      req.mutable_running()->set_stage(last_finished_->finished().stage());
      req.mutable_running()->set_attempt(last_finished_->finished().attempt());
      req.mutable_running()->set_replica(last_finished_->finished().replica());
    }
  }
  v1::RegisterResponse resp;
  grpc::ClientContext rctx;
  rctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  rctx.set_wait_for_ready(true);
  grpc::Status gs = coord_->Register(&rctx, req, &resp);
  if (!gs.ok()) {
    common::Log(who, absl::StrCat("cannot register with ", opt_.coordinator, ": ", gs.error_message(), " (retrying)"));
    return false;
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) return true;
    worker_id_ = resp.worker_id();
    session_ctx_ = &ctx;
    stream = coord_->Session(&ctx);
  }
  common::Log(who, absl::StrCat("registered as worker ", resp.worker_id()));
  auto heartbeat = [this, id = resp.worker_id()]() {
    v1::WorkerMessage m;
    m.set_worker_id(id);
    absl::MutexLock l(&mu_);
    if (job_ && !job_done_) {
      m.mutable_heartbeat()->set_running_job_id(job_->job_id());
      m.mutable_heartbeat()->set_running_attempt(job_->attempt());
      *m.mutable_heartbeat()->mutable_activity() = job_->Activity();  // for the progress watchdog
    } else {
      m.mutable_heartbeat();
    }
    return m;
  };
  // The first message binds the stream to the worker id (its content is not looked at), so it is
  // written before the stream is published to the other writers.
  stream->Write(heartbeat());
  {
    // Published, and what was kept delivered, under progress_mu_, which the job thread holds while
    // it sends a report or the end of its stage (or keeps it for the next session): nothing falls
    // between the two.
    absl::MutexLock p(&progress_mu_);
    {
      absl::MutexLock w(&write_mu_);
      session_ = stream.get();
    }
    while (!unsent_progress_.empty() && Send(unsent_progress_.front())) unsent_progress_.pop_front();
    if (last_finished_) {
      last_finished_->set_worker_id(resp.worker_id());
      Send(*last_finished_);
    }
  }
  std::atomic<bool> stop{false};
  std::thread hb([&] {
    const absl::Duration every = absl::Milliseconds(std::max<uint32_t>(100, resp.heartbeat_interval_ms()));
    absl::Time next = absl::Now() + every;
    while (!stop.load()) {
      absl::SleepFor(std::min(absl::Milliseconds(50), next - absl::Now()));
      if (absl::Now() >= next) {
        if (!Send(heartbeat())) break;
        next += every;
      }
    }
  });
  v1::CoordinatorMessage msg;
  while (stream->Read(&msg)) {
    JoinFinishedJob();
    if (msg.has_assign()) {
      StartJob(msg.assign());
    } else if (msg.has_cancel()) {
      CancelJob(msg.cancel().job_id(), msg.cancel().attempt(), msg.cancel().reason());
    } else if (msg.has_checkpoint_floor()) {
      OnFloor(msg.checkpoint_floor());
    } else if (msg.has_probe_peers() && prober_) {
      std::vector<LinkProber::Peer> peers;
      for (const v1::ProbePeer& p : msg.probe_peers().peers()) peers.push_back({p.worker_id(), p.name(), p.probe_address()});
      prober_->SetPeers(peers);
    }
  }
  stop = true;
  hb.join();
  {
    absl::MutexLock p(&progress_mu_);
    {
      absl::MutexLock w(&write_mu_);
      session_ = nullptr;
    }
    // Written to the stream is not read by the coordinator: the last few go again (duplicates are
    // ignored), ahead of the ones made from now on.
    unsent_progress_.insert(unsent_progress_.begin(), recent_progress_.begin(), recent_progress_.end());
    recent_progress_.clear();
  }
  grpc::Status end = stream->Finish();
  bool shutting_down;
  {
    absl::MutexLock l(&mu_);
    session_ctx_ = nullptr;
    shutting_down = shutdown_;
  }
  if (!shutting_down) {
    // The stage keeps running: a restarted coordinator re-attaches it when this worker registers
    // again, and one that declared this worker dead meanwhile cancels it then (docs/recovery.md).
    common::Log(who, absl::StrCat("lost the coordinator (", end.error_message(), "); reconnecting"));
  }
  return true;
}

void Worker::StartJob(const v1::StageAssignment& a) {
  const std::string who = absl::StrCat("worker ", opt_.name);
  JoinFinishedJob();  // a stage that ended just now (its thread may still be on its way out)
  v1::WorkerMessage busy;
  {
    absl::MutexLock l(&mu_);
    if (job_) {
      busy.set_worker_id(worker_id_);
      v1::JobFinished* f = busy.mutable_finished();
      f->set_job_id(a.job_id());
      f->set_stage(a.stage());
      f->set_replica(a.replica_index());
      f->set_attempt(a.attempt());
      f->set_retryable(true);  // the other job ends; a later attempt may find this worker free
      f->set_error(absl::StrCat("worker ", opt_.name, " is busy with job ", job_->job_id()));
    } else {
      common::Log(who, absl::StrCat("job ", a.job_id(), ": stage ", a.stage(), " of ", a.spec().stages(),
                                    " (layers ", a.layer_begin(), "..", a.layer_end() - 1, ")",
                                    a.attempt() > 0 ? absl::StrCat(", attempt ", a.attempt()) : "",
                                    a.restore_step() > 0 ? absl::StrCat(", restoring step ", a.restore_step()) : ""));
      const uint64_t id = worker_id_;
      job_ = std::make_shared<StageRunner>(a, opt_.data_dir, device_, [this, id](const v1::StepProgress& p) {
        v1::WorkerMessage m;
        m.set_worker_id(id);
        *m.mutable_progress() = p;
        // Kept while the coordinator is away (its loss curve would have a gap), up to a bound. Not
        // under mu_: a slow write would hold up everything else that needs it.
        absl::MutexLock l(&progress_mu_);
        if (Send(m)) {
          if (recent_progress_.size() >= kRecentProgress) recent_progress_.pop_front();
          recent_progress_.push_back(std::move(m));
          return;
        }
        if (unsent_progress_.size() >= kMaxUnsentProgress) unsent_progress_.pop_front();
        unsent_progress_.push_back(std::move(m));
      }, metrics_.get());
      job_->OnReplicated([this, id, who, replica = a.replica_index()](const v1::CheckpointReplicated& r) {
        if (!r.error().empty()) common::Log(who, absl::StrCat("job ", r.job_id(), " step ", r.step(), ": ", r.error()));
        v1::WorkerMessage m;
        m.set_worker_id(id);
        *m.mutable_replicated() = r;
        m.mutable_replicated()->set_replica(replica);
        Send(m);
      });
      job_->SetFetchLimit(opt_.replica_max_bytes);
      job_->SetTestHang(opt_.test_hang);
      job_->SetAllowedPaths(opt_.allow_paths);
      job_->SetCollective(collective_service_.get());
      job_->SetRegion(opt_.region);
      // Pruned on the coordinator's floor and served to recovering workers: only a directory the
      // stage may use (a refused one fails the stage in Setup).
      if (absl::StatusOr<std::string> dir = job_->CheckedCheckpointDir(); dir.ok()) {
        checkpoint_dirs_[a.job_id()] = OwnCheckpoints{*dir, a.replica_index()};
      }
      {
        absl::MutexLock p(&progress_mu_);
        last_finished_.reset();
        recent_progress_.clear();
        unsent_progress_.clear();  // of an earlier job (nobody wants them now)
      }
      job_done_ = false;
      job_thread_ = std::thread([this, id, who, runner = job_] {
        v1::WorkerMessage m;
        m.set_worker_id(id);
        *m.mutable_finished() = runner->Run();
        common::Log(who, absl::StrCat("job ", runner->job_id(), " stage ", runner->stage(),
                                      m.finished().ok() ? " finished" : " failed: ", m.finished().error(),
                                      runner->SlowStopNote()));
        // Done before the end is sent, so that an assignment the coordinator answers it with finds
        // this worker free; sent under progress_mu_, so that a session opening meanwhile delivers it.
        {
          absl::MutexLock l(&mu_);
          job_done_ = true;
        }
        absl::MutexLock p(&progress_mu_);
        Send(m);
        last_finished_ = std::move(m);
      });
      return;
    }
  }
  Send(busy);
}

void Worker::JoinFinishedJob() {
  std::thread t;
  {
    absl::MutexLock l(&mu_);
    if (!job_ || !job_done_) return;
    t = std::move(job_thread_);
    job_.reset();
  }
  if (t.joinable()) t.join();
}

void Worker::CancelJob(uint64_t job_id, int attempt, const std::string& reason) {
  absl::MutexLock l(&mu_);
  if (job_ && job_->job_id() == job_id && job_->attempt() <= attempt &&
      job_->Cancel(absl::CancelledError(absl::StrCat("cancelled by the coordinator: ", reason)))) {
    common::Log(absl::StrCat("worker ", opt_.name), absl::StrCat("job ", job_id, " cancelled: ", reason));
  }
}

void Worker::OnFloor(const v1::CheckpointFloor& f) {
  std::string dir;
  int stage = -1;
  {
    absl::MutexLock l(&mu_);
    auto it = checkpoint_dirs_.find(f.job_id());
    if (it != checkpoint_dirs_.end()) dir = it->second.dir;
    if (job_ && job_->job_id() == f.job_id()) {
      job_->SetFloor(f.step());
      stage = job_->stage();
    }
  }
  if (stage >= 0 && !dir.empty()) PruneStepFiles(dir, stage, f.step());
  checkpoint_store_->Prune(f.job_id(), f.step());
}

std::string Worker::LocateOwnCheckpoint(uint64_t job_id, int stage, int replica, int64_t step) {
  absl::MutexLock l(&mu_);
  auto it = checkpoint_dirs_.find(job_id);
  if (it == checkpoint_dirs_.end() || it->second.replica != replica) return "";
  const std::string path = StepCheckpointPath(it->second.dir, stage, step);
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}

absl::StatusOr<std::shared_ptr<Inbox>> Worker::Find(uint64_t job_id, int attempt, int from_stage, int from_replica,
                                                    absl::Duration wait) {
  absl::MutexLock l(&mu_);
  // A newer attempt than the one running is waited for (its assignment may not have been
  // processed yet); an older one is refused at once.
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || (job_ && !job_done_ && job_->job_id() == job_id && job_->attempt() >= attempt);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), wait) || shutdown_) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", opt_.name, " is not running job ", job_id));
  }
  if (job_->attempt() != attempt) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", opt_.name, " runs attempt ", job_->attempt(),
                                                      " of job ", job_id, ", not attempt ", attempt));
  }
  return job_->InboxFrom(from_stage, from_replica);
}

absl::Status Worker::CheckSender(uint64_t job_id, int from_stage, int from_replica, const std::string& sender) {
  absl::MutexLock l(&mu_);
  if (!job_ || job_->job_id() != job_id) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", opt_.name, " is not running job ", job_id));
  }
  const v1::StagePeer* p = AssignedNeighbour(job_->assignment(), from_stage, from_replica);
  if (p != nullptr && !p->name().empty() && p->name() == sender) return absl::OkStatus();
  const std::string from = absl::StrCat("stage ", from_stage, HasReplicas(job_->assignment().spec())
                                                                  ? absl::StrCat(" replica ", from_replica)
                                                                  : "");
  refusals_.Warn(sender, absl::StrCat(opt_.name, " refused a stream of job ", job_id, " from ", from, " sent by ", sender,
                                      p != nullptr ? absl::StrCat(" (its sender is ", p->name(), ")")
                                                   : " (not a neighbour)"));
  return absl::PermissionDeniedError(absl::StrCat("worker ", opt_.name, " takes job ", job_id, "'s frames from ", from,
                                                  " only from ", p != nullptr ? p->name() : "its assigned neighbours",
                                                  ", not from ", sender));
}

void Worker::Shutdown() {
  std::shared_ptr<StageRunner> job;
  std::thread t;
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) {
      // Another thread is shutting down (the signal handler's, while Run() returns and main
      // destroys this worker): wait for it to finish, or the destructor frees what it still uses.
      mu_.Await(absl::Condition(&shutdown_done_));
      return;
    }
    shutdown_ = true;
    job = job_;
    if (job) {
      job->ReleaseTestHang();
      job->Cancel(absl::CancelledError(absl::StrCat("worker ", opt_.name, " is shutting down")));
    }
    t = std::move(job_thread_);
  }
  // The job thread reports the failure on the still-open session before it closes.
  if (t.joinable()) t.join();
  {
    absl::MutexLock l(&mu_);
    job_.reset();
    if (session_ctx_) session_ctx_->TryCancel();
  }
  StopProbing();
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  absl::MutexLock l(&mu_);
  shutdown_done_ = true;
}

}  // namespace longhaul::worker
