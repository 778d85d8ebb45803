#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"

namespace longhaul::worker {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& o) {
  absl::StatusOr<torch::Device> device = stage_runtime::ParseDevice(o.device);
  if (!device.ok()) return device.status();
  std::unique_ptr<Worker> w(new Worker(o, *device));
  std::error_code ec;
  std::filesystem::create_directories(o.data_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--data-dir ", o.data_dir, ": ", ec.message()));

  w->link_service_ = std::make_unique<StageLinkService>(w.get());
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(o.listen, grpc::InsecureServerCredentials(), &port);
  ConfigureLonghaulServer(&b);
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
  w->coord_channel_ = grpc::CreateCustomChannel(o.coordinator, grpc::InsecureChannelCredentials(), LonghaulChannelArgs());
  w->coord_ = v1::Coordinator::NewStub(w->coord_channel_);
  common::Log(absl::StrCat("worker ", w->opt_.name),
              absl::StrCat("listening on ", w->address_, ", coordinator ", o.coordinator,
                           w->metrics_address_.empty() ? "" : absl::StrCat(", metrics on ", w->metrics_address_)));
  if (!note.empty()) common::Log(absl::StrCat("worker ", w->opt_.name), note);
  return w;
}

Worker::~Worker() {
  Shutdown();
  JoinFinishedJob();
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
  {
    absl::MutexLock l(&write_mu_);
    session_ = stream.get();
  }
  common::Log(who, absl::StrCat("registered as worker ", resp.worker_id()));
  auto heartbeat = [this, id = resp.worker_id()]() {
    v1::WorkerMessage m;
    m.set_worker_id(id);
    absl::MutexLock l(&mu_);
    m.mutable_heartbeat()->set_running_job_id(job_ && !job_done_ ? job_->job_id() : 0);
    return m;
  };
  Send(heartbeat());  // the first message binds the stream to the worker id
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
      CancelJob(msg.cancel().job_id(), msg.cancel().reason());
    }
  }
  stop = true;
  hb.join();
  {
    absl::MutexLock l(&write_mu_);
    session_ = nullptr;
  }
  grpc::Status end = stream->Finish();
  bool shutting_down;
  {
    absl::MutexLock l(&mu_);
    session_ctx_ = nullptr;
    shutting_down = shutdown_;
  }
  if (!shutting_down) {
    common::Log(who, absl::StrCat("lost the coordinator (", end.error_message(), "); reconnecting"));
    // The coordinator failed this worker's job when the session broke; stop it here too.
    absl::MutexLock l(&mu_);
    if (job_ && !job_done_) job_->Cancel(absl::UnavailableError("lost the coordinator"));
  }
  return true;
}

void Worker::StartJob(const v1::StageAssignment& a) {
  const std::string who = absl::StrCat("worker ", opt_.name);
  v1::WorkerMessage busy;
  {
    absl::MutexLock l(&mu_);
    if (job_) {
      busy.set_worker_id(worker_id_);
      v1::JobFinished* f = busy.mutable_finished();
      f->set_job_id(a.job_id());
      f->set_stage(a.stage());
      f->set_error(absl::StrCat("worker ", opt_.name, " is busy with job ", job_->job_id()));
    } else {
      common::Log(who, absl::StrCat("job ", a.job_id(), ": stage ", a.stage(), " of ", a.spec().stages(),
                                 " (layers ", a.layer_begin(), "..", a.layer_end() - 1, ")"));
      const uint64_t id = worker_id_;
      job_ = std::make_shared<StageRunner>(a, opt_.data_dir, device_, [this, id](const v1::StepProgress& p) {
        v1::WorkerMessage m;
        m.set_worker_id(id);
        *m.mutable_progress() = p;
        Send(m);
      }, metrics_.get());
      job_done_ = false;
      job_thread_ = std::thread([this, id, who, runner = job_] {
        v1::WorkerMessage m;
        m.set_worker_id(id);
        *m.mutable_finished() = runner->Run();
        common::Log(who, absl::StrCat("job ", runner->job_id(), " stage ", runner->stage(),
                                   m.finished().ok() ? " finished" : " failed: ", m.finished().error()));
        Send(m);
        absl::MutexLock l(&mu_);
        job_done_ = true;
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

void Worker::CancelJob(uint64_t job_id, const std::string& reason) {
  absl::MutexLock l(&mu_);
  if (job_ && job_->job_id() == job_id) {
    common::Log(absl::StrCat("worker ", opt_.name), absl::StrCat("job ", job_id, " cancelled: ", reason));
    job_->Cancel(absl::CancelledError(absl::StrCat("cancelled by the coordinator: ", reason)));
  }
}

absl::StatusOr<std::shared_ptr<Inbox>> Worker::Find(uint64_t job_id, int from_stage, absl::Duration wait) {
  absl::MutexLock l(&mu_);
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || (job_ && !job_done_ && job_->job_id() == job_id);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), wait) || shutdown_) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", opt_.name, " is not running job ", job_id));
  }
  return job_->InboxFrom(from_stage);
}

void Worker::Shutdown() {
  std::shared_ptr<StageRunner> job;
  std::thread t;
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    job = job_;
    if (job) job->Cancel(absl::CancelledError(absl::StrCat("worker ", opt_.name, " is shutting down")));
    t = std::move(job_thread_);
  }
  // The job thread reports the failure on the still-open session before it closes.
  if (t.joinable()) t.join();
  {
    absl::MutexLock l(&mu_);
    job_.reset();
    if (session_ctx_) session_ctx_->TryCancel();
  }
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

}  // namespace longhaul::worker
