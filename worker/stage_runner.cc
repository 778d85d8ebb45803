#include "worker/stage_runner.h"

#include <filesystem>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/list_dir.h"
#include "common/log.h"
#include "proto/link_spec.h"
#include "proto/replica_layout.h"
#include "proto/stage_activity.h"
#include "stage_runtime/data.h"
#include "worker/link_settings.h"
#include "worker/spec_paths.h"

namespace longhaul::worker {

using stage_runtime::PipelineOptions;

absl::StatusOr<PipelineOptions> ToPipelineOptions(const v1::JobSpec& spec) {
  PipelineOptions o;
  o.model.layers = spec.model().layers();
  o.model.hidden = spec.model().hidden();
  o.model.heads = spec.model().heads();
  o.model.context = spec.model().context();
  o.model.vocab = spec.model().vocab();
  o.stages = spec.stages();
  o.micro_batches = spec.micro_batches();
  o.micro_batch_size = spec.micro_batch_size();
  absl::StatusOr<stage_runtime::Schedule> sched = stage_runtime::ParseSchedule(spec.schedule());
  if (!sched.ok()) return sched.status();
  o.schedule = *sched;
  o.forward_codec = spec.forward_codec();
  o.backward_codec = spec.backward_codec();
  const v1::OptimizerSpec& os = spec.optimizer();
  o.optimizer.lr = os.lr();
  o.optimizer.min_lr = os.min_lr();
  o.optimizer.warmup_steps = os.warmup_steps();
  o.optimizer.total_steps = static_cast<int>(spec.steps());
  o.optimizer.beta1 = os.beta1();
  o.optimizer.beta2 = os.beta2();
  o.optimizer.eps = os.eps();
  o.optimizer.weight_decay = os.weight_decay();
  o.optimizer.clip_norm = os.clip_norm();
  o.seed = spec.seed();
  o.codec_threads = spec.codec_threads();
  absl::StatusOr<stage_runtime::Precision> precision = stage_runtime::ParsePrecision(spec.precision());
  if (!precision.ok()) return precision.status();
  o.precision = *precision;
  if (absl::Status s = o.model.Validate(); !s.ok()) return s;
  if (o.codec_threads < 1) return absl::InvalidArgumentError("codec_threads must be >= 1");
  return o;
}

namespace {

std::string PeerName(const v1::StagePeer& p, int stage) {
  return absl::StrCat("stage ", stage, " (worker ", p.name(), " at ", p.address(), ")");
}

// Whether a stage that stopped with `s` may succeed when the job is restarted: it was cancelled or
// a link or neighbour went away (docs/recovery.md). Anything else is the stage's own error (its
// data, its checkpoint, its device) and would only happen again.
bool Retryable(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

bool Exists(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

}  // namespace

// A link as the stage loop sees it: the GrpcLink, with the time the compute thread spends blocked
// in it recorded as the runner's activity (waiting on that neighbour).
class ActivityLink final : public stage_runtime::Link {
 public:
  ActivityLink(StageRunner* runner, stage_runtime::Link* link, int peer) : runner_(runner), link_(link), peer_(peer) {}

  // Each call restores the phase it interrupted: computing, or the data-parallel sync whose norm
  // exchange goes over these links.
  absl::Status Send(stage_runtime::LinkMessage m, bool measure_error) override {
    const v1::StageActivity::Phase before = runner_->Enter(v1::StageActivity::PHASE_SEND, peer_);
    absl::Status s = link_->Send(std::move(m), measure_error);
    runner_->Enter(before);
    return s;
  }
  absl::StatusOr<stage_runtime::LinkMessage> Receive(absl::Duration timeout) override {
    const v1::StageActivity::Phase before = runner_->Enter(v1::StageActivity::PHASE_RECEIVE, peer_);
    absl::StatusOr<stage_runtime::LinkMessage> m = link_->Receive(timeout);
    runner_->Enter(before);
    return m;
  }
  absl::Status Finish() override {
    const v1::StageActivity::Phase before = runner_->Enter(v1::StageActivity::PHASE_SEND, peer_);
    absl::Status s = link_->Finish();
    runner_->Enter(before);
    return s;
  }
  void Abort(absl::Status why) override { link_->Abort(std::move(why)); }
  stage_runtime::LinkStats stats() override { return link_->stats(); }
  absl::Duration TakeSendWait() override { return link_->TakeSendWait(); }
  const std::string& peer() const override { return link_->peer(); }

 private:
  StageRunner* const runner_;
  stage_runtime::Link* const link_;
  const int peer_;
};

// The data-parallel synchronisation as the stage loop sees it: the time in it is the runner's
// activity "synchronising with its replicas", which the watchdog counts as waiting (a replica
// stays there while another one hangs).
class ActivitySync final : public stage_runtime::GradientSync {
 public:
  ActivitySync(StageRunner* runner, stage_runtime::GradientSync* sync) : runner_(runner), sync_(sync) {}
  absl::StatusOr<Outcome> SyncAndStep(uint64_t step, double loss, const ExchangeNorms& exchange_norms) override {
    const v1::StageActivity::Phase before = runner_->Enter(v1::StageActivity::PHASE_SYNC);
    absl::StatusOr<Outcome> o = sync_->SyncAndStep(step, loss, exchange_norms);
    runner_->Enter(before);
    return o;
  }
  void Abort(const absl::Status& why) override { sync_->Abort(why); }
  stage_runtime::TensorFile CheckpointState() const override { return sync_->CheckpointState(); }

 private:
  StageRunner* const runner_;
  stage_runtime::GradientSync* const sync_;
};

v1::StageActivity::Phase StageRunner::Enter(v1::StageActivity::Phase phase, int peer) {
  absl::MutexLock l(&activity_mu_);
  const v1::StageActivity::Phase before = phase_;
  phase_ = phase;
  phase_peer_ = peer;
  phase_since_ = absl::Now();
  return before;
}

v1::StageActivity StageRunner::Activity() {
  v1::StageActivity a;
  absl::MutexLock l(&activity_mu_);
  a.set_phase(phase_);
  if (phase_ == v1::StageActivity::PHASE_RECEIVE || phase_ == v1::StageActivity::PHASE_SEND) a.set_peer_stage(phase_peer_);
  a.set_step(steps_done_);
  a.set_seconds(absl::ToDoubleSeconds(absl::Now() - phase_since_));
  return a;
}

std::string StageRunner::CheckpointDir(const v1::JobSpec& spec, const std::string& data_dir, uint64_t job_id) {
  return spec.checkpoint_dir().empty() ? absl::StrCat(data_dir, "/jobs/", job_id) : spec.checkpoint_dir();
}

StageRunner::StageRunner(v1::StageAssignment assignment, std::string data_dir, torch::Device device,
                         ProgressFn progress, WorkerMetrics* metrics)
    : a_(std::move(assignment)),
      data_dir_(std::move(data_dir)),
      device_(device),
      progress_(std::move(progress)),
      metrics_(metrics),
      first_(a_.stage() == 0),
      last_(a_.stage() == a_.spec().stages() - 1) {
  // Inboxes exist from construction so a neighbour that starts sending early finds them. They
  // hold a step's messages in one direction (stage_runtime::LinkCapacity).
  const size_t cap = static_cast<size_t>(std::max(1, a_.spec().micro_batches())) + 1;
  // Tensors for a stage on a CUDA device are decoded there (links.codec_device, parsed once here;
  // an invalid value is reported by Setup).
  const std::string& cd = a_.spec().links().codec_device();
  codec_device_ = cd.empty() ? codec::CodecDevice::kAuto : codec::ParseCodecDevice(cd);
  const DecodeTarget decode = DecodeTargetFor(device_, codec_device_.value_or(codec::CodecDevice::kAuto));
  // A peer may not announce a frame larger than this job's largest tensor can need (link_receiver.h).
  const v1::JobSpec& js = a_.spec();
  const int64_t max_frame = FrameLimitFor(js.micro_batch_size(), js.model().context(), js.model().hidden());
  for (const int n : {a_.stage() - 1, a_.stage() + 1}) {
    if (n < 0 || n >= js.stages()) continue;
    for (const int q : ExchangingReplicas(js, a_.stage(), a_.replica_index(), n)) {
      const v1::StagePeer* p = AssignedNeighbour(a_, n, q);
      if (p == nullptr) {  // Setup fails with this
        neighbours_ = absl::InvalidArgumentError(
            absl::StrCat("the assignment does not name replica ", q, " of stage ", n, ", which this replica exchanges "
                         "micro-batches with"));
        continue;
      }
      Neighbour nb;
      nb.stage = n;
      nb.replica = q;
      nb.peer = *p;
      nb.inbox = std::make_shared<Inbox>(cap, PeerName(*p, n), decode, max_frame);
      (n < a_.stage() ? prev_ : next_).push_back(std::move(nb));
    }
  }
}

StageRunner::~StageRunner() = default;

const v1::StagePeer* AssignedNeighbour(const v1::StageAssignment& a, int stage, int replica) {
  const int s = a.stage();
  if ((stage != s - 1 && stage != s + 1) || stage < 0 || stage >= a.spec().stages()) return nullptr;
  const std::vector<int> exchanging = ExchangingReplicas(a.spec(), s, a.replica_index(), stage);
  if (std::find(exchanging.begin(), exchanging.end(), replica) == exchanging.end()) return nullptr;
  const auto& all = stage < s ? a.prev_replicas() : a.next_replicas();
  // An assignment without the lists (an older coordinator) names the one neighbour of equal counts.
  if (all.empty()) return stage < s ? &a.prev() : &a.next();
  return replica < all.size() ? &all[replica] : nullptr;
}

absl::StatusOr<std::shared_ptr<Inbox>> StageRunner::InboxFrom(int from_stage, int from_replica) {
  for (const std::vector<Neighbour>* side : {&prev_, &next_}) {
    for (const Neighbour& n : *side) {
      if (n.stage == from_stage && n.replica == from_replica) return n.inbox;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("job ", a_.job_id(), ": stage ", a_.stage(),
                                                 " has no link from stage ", from_stage, " replica ", from_replica));
}

absl::Status StageRunner::Cancelled() {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

bool StageRunner::Cancel(absl::Status why) {
  absl::MutexLock l(&mu_);
  if (!cancelled_.ok()) return false;
  cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
  cancelled_at_ = absl::Now();
  activity_at_cancel_ = Activity();
  for (const std::vector<Neighbour>* side : {&prev_, &next_}) {
    for (const Neighbour& n : *side) n.inbox->Cancel(cancelled_);
  }
  if (live_loop_ != nullptr) live_loop_->Cancel(cancelled_);
  return true;
}

std::string StageRunner::SlowStopNote() {
  absl::MutexLock l(&mu_);
  if (cancelled_.ok()) return "";
  const absl::Duration took = absl::Now() - cancelled_at_;
  if (took < kSlowStop) return "";
  return absl::StrCat(" (stopped ", absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(1))),
                      " after its cancel; it was ", DescribeActivity(activity_at_cancel_), " when cancelled)");
}

absl::StatusOr<std::unique_ptr<GrpcLink>> StageRunner::Connect(Neighbour& n, bool forward,
                                                              const codec::Codec* codec) {
  const v1::JobSpec& spec = a_.spec();
  const v1::StagePeer& peer = n.peer;
  // Different jitter/loss draws per stage and direction, reproducible per job.
  absl::StatusOr<LinkSettings> ls = ResolveLinkSpec(LinkSpecBetween(spec.links(), region_, peer.region()),
                                                    spec.seed() * 1000 + a_.stage() * 2 + (forward ? 1 : 2));
  if (!ls.ok()) return ls.status();
  SenderOptions so;
  so.target = peer.address();
  so.peer = PeerName(peer, a_.stage() + (forward ? 1 : -1));
  so.peer_worker = peer.name();
  so.job_id = a_.job_id();
  so.attempt = a_.attempt();
  so.from_stage = a_.stage();
  so.from_replica = a_.replica_index();
  so.profile = ls->profile;
  n.rate = ls->profile.paced() ? ls->profile.pace_bytes_per_s : ls->profile.rate_bytes_per_s;
  so.streams = ls->streams;
  so.codec_device = ls->codec_device;
  so.queue_capacity = stage_runtime::LinkCapacity(opt_);
  so.codec_threads = opt_.codec_threads;
  absl::StatusOr<std::unique_ptr<LinkSender>> s = LinkSender::Start(so, codec);
  if (!s.ok()) return s.status();
  return std::make_unique<GrpcLink>(n.inbox, std::move(*s));
}

stage_runtime::LinkFan StageRunner::Fan(const std::vector<Neighbour>& ns) const {
  if (ns.empty()) return {};
  std::vector<std::pair<int, stage_runtime::Link*>> links;
  for (const Neighbour& n : ns) links.emplace_back(n.replica, n.watched.get());
  return stage_runtime::LinkFan::ForReplica(ReplicaCounts(a_.spec()), a_.spec().micro_batches(), a_.stage(),
                                            a_.replica_index(), ns.front().stage, links);
}

absl::Status StageRunner::Setup() {
  absl::StatusOr<PipelineOptions> o = ToPipelineOptions(a_.spec());
  if (!o.ok()) return o.status();
  opt_ = *o;
  const v1::JobSpec& spec = a_.spec();
  replicas_ = StageReplicas(spec, a_.stage());
  if (replicas_ > 1) {
    if (spec.micro_batches() % replicas_ != 0 || a_.replica_group_size() != replicas_) {
      return absl::InvalidArgumentError(absl::StrCat("replicated stage: ", spec.micro_batches(), " micro-batches, ",
                                                     replicas_, " replicas, a group of ", a_.replica_group_size()));
    }
    opt_.micro_batches = ReplicaMicroBatches(spec, a_.stage());  // this replica's share of the step
  }
  if (!neighbours_.ok()) return neighbours_;
  if (first_ || last_) {
    absl::StatusOr<std::string> corpus =
        CheckSpecPath("data.corpus", spec.data_dir(), AllowedRoots({data_dir_, stage_runtime::kDefaultCorpusDir}));
    if (!corpus.ok()) return corpus.status();
    if (spec.data_format() == "text") {
      if (absl::Status s = CheckCorpusSize(*corpus); !s.ok()) return s;
    }
    absl::StatusOr<std::unique_ptr<stage_runtime::Dataset>> ds = stage_runtime::OpenDataset(
        {spec.data_format(), *corpus, opt_.model.vocab, spec.val_fraction()}, opt_.model.context);
    if (!ds.ok()) return absl::Status(ds.status().code(), absl::StrCat("data: ", ds.status().message()));
    data_ = std::move(*ds);
  }
  stage_runtime::StageSpec ss{opt_.model, {a_.layer_begin(), a_.layer_end()}, first_, last_,
                              opt_.seed, opt_.micro_batches, opt_.optimizer, device_, opt_.precision};
  absl::StatusOr<std::unique_ptr<stage_runtime::StageExecutor>> e = stage_runtime::StageExecutor::Create(ss);
  if (!e.ok()) return e.status();
  exec_ = std::move(*e);

  absl::StatusOr<std::string> checked = CheckedCheckpointDir();
  if (!checked.ok()) return checked.status();
  const std::string ckdir = *checked;
  std::error_code ec;
  std::filesystem::create_directories(ckdir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint dir ", ckdir, ": ", ec.message()));
  checkpoint_dir_ = ckdir;
  checkpoint_path_ = stage_runtime::StageCheckpointPath(ckdir, a_.stage());
  if (a_.restore_step() > 0) {
    if (absl::Status s = Restore(ckdir); !s.ok()) return s;
  }
  if (a_.has_replica() && !a_.replica().address().empty()) {
    replicator_ = std::make_unique<CheckpointReplicator>(
        CheckpointReplicator::Target{a_.replica().worker_id(), a_.replica().name(), a_.replica().address()},
        a_.job_id(), a_.stage(), a_.replica_index(), a_.attempt(), replicated_);
  }

  absl::StatusOr<std::unique_ptr<codec::Codec>> fc = codec::MakeCodec(opt_.forward_codec);
  if (!fc.ok()) return fc.status();
  absl::StatusOr<std::unique_ptr<codec::Codec>> bc = codec::MakeCodec(opt_.backward_codec);
  if (!bc.ok()) return bc.status();
  fwd_codec_ = std::move(*fc);
  bwd_codec_ = std::move(*bc);
  // links.codec_device gpu on a stage that computes on a CUDA device: fail here, naming the reason,
  // rather than at the first Send.
  if (!codec_device_.ok()) return codec_device_.status();
  if (device_.is_cuda() && (!first_ || !last_)) {  // a one-stage job has no links
    std::string why;
    if (*codec_device_ == codec::CodecDevice::kGpu && !codec::GpuCodecsAvailable(&why)) {
      return absl::FailedPreconditionError(absl::StrCat("links.codec_device is gpu, but ", why));
    }
  }
  // A cancellation that came while the stage was being built stops it before the connects (which
  // may wait for a peer); one that comes later reaches the loop below.
  if (absl::Status c = Cancelled(); !c.ok()) return c;
  for (std::vector<Neighbour>* side : {&next_, &prev_}) {
    const bool forward = side == &next_;
    for (Neighbour& n : *side) {
      if (absl::Status c = Cancelled(); !c.ok()) return c;
      absl::StatusOr<std::unique_ptr<GrpcLink>> l = Connect(n, forward, (forward ? fwd_codec_ : bwd_codec_).get());
      if (!l.ok()) return l.status();
      n.link = std::move(*l);
      n.watched = std::make_unique<ActivityLink>(this, n.link.get(), n.stage);
    }
  }
  loop_ = std::make_unique<stage_runtime::StageLoop>(
      opt_, a_.stage(), exec_.get(), Fan(prev_), Fan(next_),
      stage_runtime::CheckpointPolicy{checkpoint_path_, spec.checkpoint_interval(), spec.steps()});
  if (replicas_ > 1) {
    if (absl::Status s = SetupReplicaSync(); !s.ok()) return s;
    watched_sync_ = std::make_unique<ActivitySync>(this, sync_.get());
    loop_->SetGradientSync(watched_sync_.get());
  }
  absl::MutexLock l(&mu_);
  live_loop_ = loop_.get();
  if (!cancelled_.ok()) loop_->Cancel(cancelled_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> StageRunner::CheckedCheckpointDir() const {
  absl::StatusOr<std::string> dir =
      CheckSpecPath("checkpoint.dir", CheckpointDir(a_.spec(), data_dir_, a_.job_id()), AllowedRoots({data_dir_}));
  if (!dir.ok()) return dir.status();
  // Replicas may share a checkpoint directory (a spec's dir on one machine).
  if (HasReplicas(a_.spec())) return absl::StrCat(*dir, "/replica-", a_.replica_index());
  return dir;
}

std::vector<std::string> StageRunner::AllowedRoots(std::vector<std::string> own) const {
  own.insert(own.end(), allowed_paths_.begin(), allowed_paths_.end());
  return own;
}

absl::Status StageRunner::Restore(const std::string& dir) {
  const int64_t step = a_.restore_step();
  const int stage = a_.stage();
  const std::string slot = HasReplicas(a_.spec())
                               ? absl::StrCat("stage ", stage, " replica ", a_.replica_index())
                               : absl::StrCat("stage ", stage);
  const std::string who = absl::StrCat("job ", a_.job_id(), " ", slot);
  std::string path = StepCheckpointPath(dir, stage, step);
  const std::string held = ReplicaPath(data_dir_, a_.job_id(), stage, a_.replica_index(), step);
  if (!Exists(path)) path = held;
  if (!Exists(path)) {
    // Fetched next to the stage's own checkpoints, so this worker holds it from now on.
    const std::string dest = StepCheckpointPath(dir, stage, step);
    std::vector<std::string> tried = {
        absl::StrCat("not in ", dir, " or ", std::filesystem::path(held).parent_path().string())};
    bool unreachable_only = true;
    path.clear();
    for (const v1::StagePeer& src : a_.restore_from()) {
      if (absl::Status c = Cancelled(); !c.ok()) return c;
      const absl::Time t0 = absl::Now();
      absl::StatusOr<int64_t> n =
          FetchCheckpoint(src.address(), src.name(), a_.job_id(), stage, a_.replica_index(), step, dest, fetch_limit_);
      if (n.ok()) {
        common::Log(who, absl::StrCat("fetched the checkpoint of step ", step, " (", *n, " bytes) from worker ",
                                      src.name(), " in ", absl::FormatDuration(absl::Now() - t0)));
        path = dest;
        break;
      }
      unreachable_only &= Retryable(n.status());
      tried.push_back(absl::StrCat("worker ", src.name(), " (", src.address(), "): ", n.status().message()));
    }
    if (path.empty()) {
      const std::string msg = absl::StrCat("no copy of ", slot, "'s checkpoint of step ", step,
                                           " could be had: ", absl::StrJoin(tried, "; "));
      // Holders that could not be reached may be back (or replaced) at the next attempt.
      return unreachable_only && a_.restore_from_size() > 0 ? absl::UnavailableError(msg)
                                                            : absl::FailedPreconditionError(msg);
    }
  }
  if (absl::Status s = exec_->LoadCheckpoint(path, &restored_sync_state_); !s.ok()) return s;
  if (exec_->step() != step) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " holds step ", exec_->step(), ", not ", step));
  }
  common::Log(who, absl::StrCat("restored step ", step, " from ", path));
  return absl::OkStatus();
}

void StageRunner::KeepCheckpoint(int64_t step) {
  if (absl::Status s = KeepStepFile(checkpoint_path_, checkpoint_dir_, a_.stage(), step); !s.ok()) {
    common::Log(absl::StrCat("job ", a_.job_id(), " stage ", a_.stage()), std::string(s.message()));
    return;
  }
  PruneStepFiles(checkpoint_dir_, a_.stage(), floor_.load());
  if (replicator_) replicator_->Enqueue(step, StepCheckpointPath(checkpoint_dir_, a_.stage(), step));
}

absl::Status StageRunner::RunSteps() {
  const v1::JobSpec& spec = a_.spec();
  std::vector<stage_runtime::Batch> batches;
  {
    absl::MutexLock l(&activity_mu_);
    steps_done_ = exec_->step();
  }
  Enter(v1::StageActivity::PHASE_COMPUTE);
  for (int64_t step = exec_->step(); step < spec.steps(); ++step) {
    if (test_hang_.at_step == step + 1 && a_.attempt() == 0 && (test_hang_.stage < 0 || test_hang_.stage == a_.stage())) {
      common::Log(absl::StrCat("job ", a_.job_id(), " stage ", a_.stage()),
                  absl::StrCat("TEST HOOK: hanging before step ", step + 1, " (LONGHAUL_TEST_HANG_AT_STEP)"));
      while (!hang_released_.load()) absl::SleepFor(absl::Milliseconds(50));
      return absl::CancelledError("the test hook's hang was released (worker shutting down)");
    }
    const absl::Time t0 = absl::Now();
    // Stage 0 needs the tokens, the last stage the labels: both sample the same micro-batches.
    batches.clear();
    // Replica r takes the step's micro-batches r*m .. r*m+m-1 (m = its share): the replicas together
    // sample what one replica would.
    const int mb0 = a_.replica_index() * opt_.micro_batches;
    for (int mb = 0; (first_ || last_) && mb < opt_.micro_batches; ++mb) {
      batches.push_back(data_->Sample(stage_runtime::Split::kTrain, opt_.seed, step, mb0 + mb, opt_.micro_batch_size,
                                      opt_.model.context));
    }
    absl::StatusOr<stage_runtime::StepResult> r = loop_->Step(batches);
    if (!r.ok()) return r.status();
    if (r->checkpointed) KeepCheckpoint(exec_->step());
    {
      absl::MutexLock l(&activity_mu_);
      steps_done_ = exec_->step();
    }
    StageStepSample sample;
    const v1::StepProgress p = Progress(*r, absl::Now() - t0, &sample);
    if (metrics_ != nullptr) metrics_->RecordStep(sample);
    if (progress_) progress_(p);
  }
  return loop_->Finish();  // the neighbours need every message we queued
}

v1::JobFinished StageRunner::Run() {
  v1::JobFinished r;
  r.set_job_id(a_.job_id());
  r.set_stage(a_.stage());
  r.set_attempt(a_.attempt());
  r.set_replica(a_.replica_index());
  absl::Status st = Setup();
  if (st.ok()) st = RunSteps();
  {
    absl::MutexLock l(&mu_);
    // A cancellation wins over the errors it caused (a broken link, a failed receive).
    if (!st.ok() && !cancelled_.ok()) st = cancelled_;
    live_loop_ = nullptr;
  }
  loop_.reset();
  sync_.reset();
  replicator_.reset();  // a copy in flight is moot once the stage stopped
  for (std::vector<Neighbour>* side : {&prev_, &next_}) {
    for (Neighbour& n : *side) {
      n.watched.reset();
      n.link.reset();  // joins the sender's threads
      n.inbox->Cancel(absl::CancelledError("job over"));
    }
  }
  r.set_ok(st.ok());
  r.set_retryable(!st.ok() && Retryable(st));
  if (!st.ok()) r.set_error(absl::StrCat("stage ", a_.stage(), ": ", st.message()));
  r.set_checkpoint_path(checkpoint_path_);
  return r;
}

}  // namespace longhaul::worker
