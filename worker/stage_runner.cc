#include "worker/stage_runner.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "stage_runtime/data.h"

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
  o.codec_threads = std::max(1, spec.codec_threads());
  if (absl::Status s = o.model.Validate(); !s.ok()) return s;
  return o;
}

namespace {

std::string PeerName(const v1::StagePeer& p, int stage) {
  return absl::StrCat("stage ", stage, " (worker ", p.name(), " at ", p.address(), ")");
}

const char* DirName(v1::Direction d) {
  switch (d) {
    case v1::DIRECTION_FORWARD: return "activation";
    case v1::DIRECTION_BACKWARD: return "gradient";
    case v1::DIRECTION_NORM_PARTIAL: return "partial gradient norm";
    case v1::DIRECTION_NORM_TOTAL: return "total gradient norm";
    default: return "unknown";
  }
}

}  // namespace

StageRunner::StageRunner(v1::StageAssignment assignment, std::string data_dir, ProgressFn progress)
    : a_(std::move(assignment)),
      data_dir_(std::move(data_dir)),
      progress_(std::move(progress)),
      first_(a_.stage() == 0),
      last_(a_.stage() == a_.spec().stages() - 1) {
  // Inboxes exist from construction so a neighbour that starts sending early finds them. Their
  // capacity covers a whole step's frames in one direction plus the norm frame, so a receiver never
  // stops reading within a step (see the deadlock note in docs/threading.md).
  const size_t cap = static_cast<size_t>(std::max(1, a_.spec().micro_batches())) + 1;
  if (!first_) from_prev_ = std::make_shared<Inbox>(cap, PeerName(a_.prev(), a_.stage() - 1));
  if (!last_) from_next_ = std::make_shared<Inbox>(cap, PeerName(a_.next(), a_.stage() + 1));
}

absl::StatusOr<std::shared_ptr<Inbox>> StageRunner::InboxFrom(int from_stage) {
  if (from_stage == a_.stage() - 1 && from_prev_) return from_prev_;
  if (from_stage == a_.stage() + 1 && from_next_) return from_next_;
  return absl::InvalidArgumentError(absl::StrCat("job ", a_.job_id(), ": stage ", a_.stage(),
                                                 " has no link from stage ", from_stage));
}

void StageRunner::Cancel(absl::Status why) {
  absl::MutexLock l(&mu_);
  if (!cancelled_.ok()) return;
  cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
  if (from_prev_) from_prev_->Cancel(cancelled_);
  if (from_next_) from_next_->Cancel(cancelled_);
  for (LinkSender* s : live_senders_) {
    if (s) s->Abort(cancelled_);
  }
}

absl::Status StageRunner::CheckCancelled() {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

absl::Status StageRunner::Setup() {
  absl::StatusOr<PipelineOptions> o = ToPipelineOptions(a_.spec());
  if (!o.ok()) return o.status();
  opt_ = *o;
  const v1::JobSpec& spec = a_.spec();
  if (first_ || last_) {
    const std::string dir = spec.data_dir().empty() ? stage_runtime::kDefaultCorpusDir : spec.data_dir();
    absl::StatusOr<stage_runtime::TextDataset> ds =
        stage_runtime::TextDataset::FromDirectory(dir, spec.val_fraction() > 0 ? spec.val_fraction() : 0.1);
    if (!ds.ok()) return absl::Status(ds.status().code(), absl::StrCat("data: ", ds.status().message()));
    data_ = std::make_unique<stage_runtime::TextDataset>(std::move(*ds));
  }
  stage_runtime::StageSpec ss{opt_.model, {a_.layer_begin(), a_.layer_end()}, first_, last_,
                              opt_.seed, opt_.micro_batches, opt_.optimizer};
  absl::StatusOr<std::unique_ptr<stage_runtime::StageExecutor>> e = stage_runtime::StageExecutor::Create(ss);
  if (!e.ok()) return e.status();
  exec_ = std::move(*e);

  const std::string ckdir = spec.checkpoint_dir().empty()
                                ? absl::StrCat(data_dir_, "/jobs/", a_.job_id())
                                : spec.checkpoint_dir();
  std::error_code ec;
  std::filesystem::create_directories(ckdir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint dir ", ckdir, ": ", ec.message()));
  checkpoint_path_ = absl::StrCat(ckdir, "/stage-", a_.stage(), ".safetensors");

  absl::StatusOr<std::unique_ptr<codec::Codec>> fc = codec::MakeCodec(opt_.forward_codec);
  if (!fc.ok()) return fc.status();
  absl::StatusOr<std::unique_ptr<codec::Codec>> bc = codec::MakeCodec(opt_.backward_codec);
  if (!bc.ok()) return bc.status();
  fwd_codec_ = std::move(*fc);
  bwd_codec_ = std::move(*bc);

  SenderOptions so;
  so.job_id = a_.job_id();
  so.from_stage = a_.stage();
  const v1::LinkSpec& ls = spec.links();
  so.profile.rate_bytes_per_s = netem::MbitToBytesPerSecond(ls.rate_mbit());
  so.profile.burst_bytes = ls.burst_bytes();
  so.profile.delay = absl::Microseconds(static_cast<int64_t>(ls.delay_ms() * 1000));
  so.profile.jitter = absl::Microseconds(static_cast<int64_t>(ls.jitter_ms() * 1000));
  so.profile.loss = ls.loss();
  so.profile.retransmit = absl::Microseconds(static_cast<int64_t>(ls.retransmit_ms() * 1000));
  so.streams = ls.streams();  // 0 (unset) is taken as 1
  // Different draws per link direction and stage, reproducible per job.
  so.profile.seed = spec.seed() * 1000 + static_cast<uint64_t>(a_.stage()) * 2;
  so.queue_capacity = static_cast<size_t>(opt_.micro_batches) + 1;
  so.codec_threads = opt_.codec_threads;
  for (int dir = 0; dir < 2; ++dir) {
    const bool fwd = dir == 0;
    if (fwd ? last_ : first_) continue;
    const v1::StagePeer& peer = fwd ? a_.next() : a_.prev();
    so.target = peer.address();
    so.profile.seed += 1;
    so.peer = PeerName(peer, a_.stage() + (fwd ? 1 : -1));
    absl::StatusOr<std::unique_ptr<LinkSender>> s = LinkSender::Start(so, fwd ? fwd_codec_.get() : bwd_codec_.get());
    if (!s.ok()) return s.status();
    (fwd ? to_next_ : to_prev_) = std::move(*s);
    absl::MutexLock l(&mu_);
    live_senders_[dir] = (fwd ? to_next_ : to_prev_).get();
    if (!cancelled_.ok()) live_senders_[dir]->Abort(cancelled_);
  }
  return absl::OkStatus();
}

absl::StatusOr<InFrame> StageRunner::Expect(Inbox& in, uint64_t step, int mb, v1::Direction dir) {
  const absl::Time t0 = absl::Now();
  // Generous: a slow link or a slow neighbour is not an error; a dead one closes the inbox, and a
  // hung one is caught by the coordinator's heartbeat timeout, which cancels the job.
  absl::StatusOr<InFrame> f = in.Pop(absl::Minutes(10));
  recv_wait_ += absl::Now() - t0;
  if (!f.ok()) return f.status();
  if (f->step != step || f->direction != dir ||
      ((dir == v1::DIRECTION_FORWARD || dir == v1::DIRECTION_BACKWARD) && f->micro_batch != mb)) {
    return absl::DataLossError(absl::StrCat("out-of-order frame from ", in.peer(), ": expected ", DirName(dir),
                                            " for step ", step, " micro-batch ", mb, ", got ", DirName(f->direction),
                                            " for step ", f->step, " micro-batch ", f->micro_batch));
  }
  return f;
}

absl::Status StageRunner::RunSteps() {
  const v1::JobSpec& spec = a_.spec();
  const int S = opt_.stages, M = opt_.micro_batches, s = a_.stage();
  const std::vector<stage_runtime::PipelineOp> ops = stage_runtime::StageSchedule(opt_.schedule, s, S, M);
  const int64_t tokens_per_step = int64_t{M} * opt_.micro_batch_size * opt_.model.context;
  int64_t last_error_samples = 0;
  double last_error_sum = 0;
  for (int64_t step = exec_->step(); step < spec.steps(); ++step) {
    const absl::Time t0 = absl::Now();
    recv_wait_ = absl::ZeroDuration();
    double loss_sum = 0;
    for (const stage_runtime::PipelineOp& op : ops) {
      if (absl::Status c = CheckCancelled(); !c.ok()) return c;
      if (op.forward) {
        // Stage 0 needs the tokens, the last stage the labels; backward needs neither.
        stage_runtime::Batch batch;
        if (first_ || last_) {
          batch = data_->Sample(stage_runtime::Split::kTrain, opt_.seed, step, op.micro_batch,
                                opt_.micro_batch_size, opt_.model.context);
        }
        torch::Tensor in = batch.tokens;
        if (!first_) {
          absl::StatusOr<InFrame> f = Expect(*from_prev_, step, op.micro_batch, v1::DIRECTION_FORWARD);
          if (!f.ok()) return f.status();
          in = std::move(f->tensor);
        }
        absl::StatusOr<torch::Tensor> out = exec_->Forward(op.micro_batch, in, last_ ? batch.labels : torch::Tensor());
        if (!out.ok()) return out.status();
        if (last_) {
          loss_sum += out->item<double>();
        } else if (absl::Status st = to_next_->Send(step, op.micro_batch, v1::DIRECTION_FORWARD, *out,
                                                    /*measure_error=*/op.micro_batch == 0);
                   !st.ok()) {
          return st;
        }
      } else {
        torch::Tensor g;
        if (!last_) {
          absl::StatusOr<InFrame> f = Expect(*from_next_, step, op.micro_batch, v1::DIRECTION_BACKWARD);
          if (!f.ok()) return f.status();
          g = std::move(f->tensor);
        }
        absl::StatusOr<torch::Tensor> gin = exec_->Backward(op.micro_batch, g);
        if (!gin.ok()) return gin.status();
        if (!first_) {
          if (absl::Status st = to_prev_->Send(step, op.micro_batch, v1::DIRECTION_BACKWARD, *gin,
                                               /*measure_error=*/op.micro_batch == 0);
              !st.ok()) {
            return st;
          }
        }
      }
    }
    // Global clipping: partial sums of squared norms down the backward chain, total back up.
    double sq = exec_->SquaredGradNorm();
    if (!last_) {
      absl::StatusOr<InFrame> f = Expect(*from_next_, step, 0, v1::DIRECTION_NORM_PARTIAL);
      if (!f.ok()) return f.status();
      sq += f->value;
    }
    double total = sq;
    if (!first_) {
      if (absl::Status st = to_prev_->SendValue(step, v1::DIRECTION_NORM_PARTIAL, sq); !st.ok()) return st;
      absl::StatusOr<InFrame> f = Expect(*from_prev_, step, 0, v1::DIRECTION_NORM_TOTAL);
      if (!f.ok()) return f.status();
      total = f->value;
    }
    if (!last_) {
      if (absl::Status st = to_next_->SendValue(step, v1::DIRECTION_NORM_TOTAL, total); !st.ok()) return st;
    }
    const double norm = std::sqrt(total);
    if (absl::Status st = exec_->Step(opt_.optimizer.ClipFactor(norm)); !st.ok()) return st;

    const bool checkpoint = (spec.checkpoint_interval() > 0 && exec_->step() % spec.checkpoint_interval() == 0) ||
                            exec_->step() == spec.steps();
    if (checkpoint) {
      if (absl::Status st = exec_->SaveCheckpoint(checkpoint_path_); !st.ok()) return st;
    }

    v1::StepProgress p;
    p.set_job_id(a_.job_id());
    p.set_stage(s);
    p.set_step(exec_->step());
    p.set_loss(last_ ? loss_sum / M : 0.0);
    p.set_grad_norm(norm);
    p.set_step_seconds(absl::ToDoubleSeconds(absl::Now() - t0));
    p.set_tokens(tokens_per_step);
    int64_t wire = 0, raw = 0, samples = 0;
    double err_sum = 0, send_wait = 0;
    for (LinkSender* l : {to_next_.get(), to_prev_.get()}) {
      if (!l) continue;
      const LinkStats st = l->stats();
      wire += st.wire_bytes;
      raw += st.raw_bytes;
      send_wait += absl::ToDoubleSeconds(l->TakeSendWait());
      if (l == to_next_.get()) {  // quantisation error is reported for the forward (activation) link
        samples = st.error_samples;
        err_sum = st.sum_rel_error;
      }
    }
    p.set_wire_bytes(wire);
    p.set_raw_bytes(raw);
    p.set_mean_rel_error(samples > last_error_samples ? (err_sum - last_error_sum) / (samples - last_error_samples) : 0.0);
    last_error_samples = samples;
    last_error_sum = err_sum;
    p.set_send_wait_seconds(send_wait);
    p.set_recv_wait_seconds(absl::ToDoubleSeconds(recv_wait_));
    if (progress_) progress_(p);
  }
  // Drain the links: the neighbours need every frame we queued.
  for (LinkSender* l : {to_next_.get(), to_prev_.get()}) {
    if (l) {
      if (absl::Status st = l->Finish(); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

v1::JobFinished StageRunner::Run() {
  v1::JobFinished r;
  r.set_job_id(a_.job_id());
  r.set_stage(a_.stage());
  absl::Status st = Setup();
  if (st.ok()) st = RunSteps();
  if (!st.ok()) {
    // A cancellation wins over the errors it caused (a broken link, a failed Pop).
    if (absl::Status c = CheckCancelled(); !c.ok()) st = c;
  }
  {
    absl::MutexLock l(&mu_);
    live_senders_[0] = live_senders_[1] = nullptr;
  }
  for (auto* l : {&to_next_, &to_prev_}) {
    if (*l) (*l)->Cancel();
  }
  if (from_prev_) from_prev_->Cancel(absl::CancelledError("job over"));
  if (from_next_) from_next_->Cancel(absl::CancelledError("job over"));
  r.set_ok(st.ok());
  if (!st.ok()) r.set_error(absl::StrCat("stage ", a_.stage(), ": ", st.message()));
  r.set_checkpoint_path(checkpoint_path_);
  return r;
}

}  // namespace longhaul::worker
