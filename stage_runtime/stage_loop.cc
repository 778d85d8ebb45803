#include "stage_runtime/stage_loop.h"

#include <cmath>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::stage_runtime {

std::string StageCheckpointPath(const std::string& dir, int stage) {
  return absl::StrCat(dir, "/stage-", stage, ".safetensors");
}

StageLoop::StageLoop(const PipelineOptions& options, int stage, StageExecutor* executor, LinkFan prev, LinkFan next,
                     CheckpointPolicy checkpoint)
    : opt_(options),
      stage_(stage),
      first_(stage == 0),
      last_(stage == options.stages - 1),
      exec_(executor),
      prev_(std::move(prev)),
      next_(std::move(next)),
      checkpoint_(std::move(checkpoint)),
      ops_(StageSchedule(options.schedule, stage, options.stages, options.micro_batches)) {}

void StageLoop::Cancel(absl::Status why) {
  {
    absl::MutexLock l(&mu_);
    if (!cancelled_.ok()) return;
    cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
  }
  for (const LinkFan* f : {&prev_, &next_}) f->Abort(why.ok() ? absl::CancelledError("cancelled") : why);
  if (sync_ != nullptr) sync_->Abort(why.ok() ? absl::CancelledError("cancelled") : why);
}

absl::Status StageLoop::Cancelled() {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

absl::StatusOr<LinkFan::Route> StageLoop::RouteOf(const LinkFan& fan, int micro_batch) const {
  const LinkFan::Route r = fan.For(micro_batch);
  if (r.link == nullptr) {
    return absl::InternalError(absl::StrCat("stage ", stage_, ": no neighbour takes micro-batch ", micro_batch));
  }
  return r;
}

absl::StatusOr<LinkMessage> StageLoop::Receive(const LinkFan& from, uint64_t step, int micro_batch, MessageKind kind) {
  absl::StatusOr<LinkFan::Route> r = RouteOf(from, micro_batch);
  if (!r.ok()) return r.status();
  // The sender numbered it as this replica does (its own fan's Route).
  return Expect(*r->link, step, micro_batch, kind);
}

absl::Status StageLoop::Send(const LinkFan& to, uint64_t step, int micro_batch, MessageKind kind, torch::Tensor t,
                             bool measure) {
  absl::StatusOr<LinkFan::Route> r = RouteOf(to, micro_batch);
  if (!r.ok()) return r.status();
  return r->link->Send(TensorMessage(step, r->micro_batch, kind, std::move(t)), measure);
}

absl::Status StageLoop::CheckMessage(const LinkMessage& m, const Link& from, uint64_t step, int micro_batch,
                                     MessageKind kind) {
  if (m.step != step || m.kind != kind || (CarriesTensor(kind) && m.micro_batch != micro_batch) ||
      CarriesTensor(kind) != m.tensor.defined()) {
    return absl::DataLossError(absl::StrCat("out-of-order message from ", from.peer(), ": expected ",
                                            MessageKindName(kind), " for step ", step, " micro-batch ", micro_batch,
                                            ", got ", MessageKindName(m.kind), " for step ", m.step,
                                            " micro-batch ", m.micro_batch));
  }
  return absl::OkStatus();
}

absl::StatusOr<LinkMessage> StageLoop::Expect(Link& from, uint64_t step, int micro_batch, MessageKind kind) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<LinkMessage> m = from.Receive(kReceiveTimeout);
  receive_wait_ += absl::Now() - t0;
  if (!m.ok()) return m.status();
  if (absl::Status s = CheckMessage(*m, from, step, micro_batch, kind); !s.ok()) return s;
  return m;
}

absl::StatusOr<double> StageLoop::ExpectNorm(const LinkFan& from, uint64_t step, MessageKind kind) {
  double value = 0;
  for (size_t i = 0; i < from.members().size(); ++i) {
    absl::StatusOr<LinkMessage> m = Expect(*from.members()[i].link, step, 0, kind);
    if (!m.ok()) return m.status();
    if (i == 0) value = m->value;
  }
  return value;
}

absl::Status StageLoop::SendNorm(const LinkFan& to, uint64_t step, MessageKind kind, double value) {
  for (const LinkFan::Member& m : to.members()) {
    if (absl::Status s = m.link->Send(ValueMessage(step, kind, value), false); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Partial sums of squared norms travel down the backward chain, the total back up; every stage
// ends with the same total.
absl::StatusOr<double> StageLoop::ExchangeNorms(uint64_t step, double sq) {
  if (!last_) {
    absl::StatusOr<double> partial = ExpectNorm(next_, step, MessageKind::kNormPartial);
    if (!partial.ok()) return partial.status();
    sq += *partial;
  }
  double total = sq;
  if (!first_) {
    if (absl::Status s = SendNorm(prev_, step, MessageKind::kNormPartial, sq); !s.ok()) return s;
    absl::StatusOr<double> t = ExpectNorm(prev_, step, MessageKind::kNormTotal);
    if (!t.ok()) return t.status();
    total = *t;
  }
  if (!last_) {
    if (absl::Status s = SendNorm(next_, step, MessageKind::kNormTotal, total); !s.ok()) return s;
  }
  return total;
}

absl::Status StageLoop::Forward(uint64_t step, int micro_batch, torch::Tensor in, const std::vector<Batch>& batches,
                                double* loss_sum) {
  absl::StatusOr<torch::Tensor> out =
      exec_->Forward(micro_batch, in, last_ ? batches[micro_batch].labels : torch::Tensor());
  if (!out.ok()) return out.status();
  if (last_) {
    *loss_sum += out->item<double>();
    return absl::OkStatus();
  }
  // The round-trip error is sampled on one micro-batch per step: it costs a decode.
  return Send(next_, step, micro_batch, MessageKind::kActivation, out->detach(), micro_batch == 0);
}

absl::StatusOr<torch::Tensor> StageLoop::Backward(uint64_t step, int micro_batch) {
  torch::Tensor g;
  if (!last_) {
    absl::StatusOr<LinkMessage> m = Receive(next_, step, micro_batch, MessageKind::kGradient);
    if (!m.ok()) return m.status();
    g = std::move(m->tensor);
    // Replica counts that differ between stages: the loss was averaged over the last stage's
    // replica's share of the step and the replicas' gradients are averaged over this stage's,
    // so N_this / N_next per boundary makes the gradient the mean over the whole step (1 with
    // equal counts: nothing is done).
    if (next_.gradient_scale() != 1) g.mul_(next_.gradient_scale());
  }
  absl::StatusOr<torch::Tensor> gin = exec_->Backward(micro_batch, g);
  if (!gin.ok()) return gin.status();
  return first_ ? torch::Tensor() : gin->detach();
}

absl::Status StageLoop::RunSchedule(uint64_t step, const std::vector<Batch>& batches, double* loss_sum) {
  for (const PipelineOp& op : ops_) {
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    if (op.forward) {
      torch::Tensor in = first_ ? batches[op.micro_batch].tokens : torch::Tensor();
      if (!first_) {
        absl::StatusOr<LinkMessage> m = Receive(prev_, step, op.micro_batch, MessageKind::kActivation);
        if (!m.ok()) return m.status();
        in = std::move(m->tensor);
      }
      if (absl::Status s = Forward(step, op.micro_batch, std::move(in), batches, loss_sum); !s.ok()) return s;
    } else {
      absl::StatusOr<torch::Tensor> gin = Backward(step, op.micro_batch);
      if (!gin.ok()) return gin.status();
      if (first_) continue;
      if (absl::Status s = Send(prev_, step, op.micro_batch, MessageKind::kGradient, *gin, op.micro_batch == 0);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

// GPipe's last stage (of several). Before its last activation has arrived, stage S - 2's link
// still carries activations to it, so a gradient sent then would share that host's download with
// them and slow both: the gradients are held until then, and sent at once. Until then the stage
// runs a forward whenever an activation is waiting and a backward (of a micro-batch it has
// forwarded) while none is, so its activations are freed as it goes where the link is slower than
// its compute, and its forwards keep pace with the link where it is not. Afterwards every
// gradient is sent as soon as it is computed. Both passes run in micro-batch order, so the
// arithmetic is GPipe's whatever the interleaving. Activations are taken without waiting
// (Receive with a zero timeout) between operations, and waited for only when there is nothing
// else to do.
absl::Status StageLoop::RunLastStageOfGPipe(uint64_t step, const std::vector<Batch>& batches, double* loss_sum) {
  const int M = opt_.micro_batches;
  std::deque<torch::Tensor> waiting;               // activations received, not yet forwarded
  std::vector<std::pair<int, torch::Tensor>> held;  // (micro-batch, gradient) while received < M
  int received = 0, forwarded = 0, backwarded = 0;
  // The next activation into `waiting`: waited for (Expect), or only if it is there (false if not).
  auto take = [&](bool wait) -> absl::StatusOr<bool> {
    absl::StatusOr<LinkFan::Route> r = RouteOf(prev_, received);
    if (!r.ok()) return r.status();
    absl::StatusOr<LinkMessage> m = wait ? Expect(*r->link, step, received, MessageKind::kActivation)
                                         : r->link->Receive(absl::ZeroDuration());
    if (!m.ok()) return !wait && absl::IsDeadlineExceeded(m.status()) ? absl::StatusOr<bool>(false) : m.status();
    if (!wait) {  // what Expect checks, for the message Receive returned
      if (absl::Status s = CheckMessage(*m, *r->link, step, received, MessageKind::kActivation); !s.ok()) return s;
    }
    waiting.push_back(std::move(m->tensor));
    ++received;
    return true;
  };
  while (backwarded < M) {
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    while (received < M) {
      absl::StatusOr<bool> got = take(/*wait=*/false);
      if (!got.ok()) return got.status();
      if (!*got) break;
    }
    if (received == M && !held.empty()) {
      for (auto& [micro_batch, g] : held) {
        if (absl::Status s = Send(prev_, step, micro_batch, MessageKind::kGradient, std::move(g), micro_batch == 0);
            !s.ok()) {
          return s;
        }
      }
      held.clear();
    }
    if (!waiting.empty()) {
      torch::Tensor in = std::move(waiting.front());
      waiting.pop_front();
      if (absl::Status s = Forward(step, forwarded, std::move(in), batches, loss_sum); !s.ok()) return s;
      ++forwarded;
    } else if (backwarded < forwarded) {
      absl::StatusOr<torch::Tensor> gin = Backward(step, backwarded);
      if (!gin.ok()) return gin.status();
      if (received < M) {
        held.emplace_back(backwarded, *gin);
      } else if (absl::Status s = Send(prev_, step, backwarded, MessageKind::kGradient, *gin, backwarded == 0);
                 !s.ok()) {
        return s;
      }
      ++backwarded;
    } else {
      absl::StatusOr<bool> got = take(/*wait=*/true);  // nothing to do until it comes
      if (!got.ok()) return got.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> StageLoop::Step(const std::vector<Batch>& batches) {
  const int M = opt_.micro_batches;
  if ((first_ || last_) && static_cast<int>(batches.size()) != M) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage_, " needs ", M, " micro-batches, got ",
                                                   batches.size()));
  }
  if ((!first_ && prev_.empty()) || (!last_ && next_.empty())) {
    return absl::FailedPreconditionError(absl::StrCat("stage ", stage_, " is missing a link to a neighbour"));
  }
  const uint64_t step = static_cast<uint64_t>(exec_->step());
  receive_wait_ = absl::ZeroDuration();
  double loss_sum = 0;
  const bool dynamic = last_ && !first_ && opt_.schedule == Schedule::kGPipe;
  if (absl::Status s = dynamic ? RunLastStageOfGPipe(step, batches, &loss_sum) : RunSchedule(step, batches, &loss_sum);
      !s.ok()) {
    return s;
  }
  double norm = 0, loss = last_ ? loss_sum / M : 0.0;
  if (sync_ != nullptr) {
    absl::StatusOr<GradientSync::Outcome> o =
        sync_->SyncAndStep(step, loss, [&](double sq) { return ExchangeNorms(step, sq); });
    if (!o.ok()) return o.status();
    norm = o->grad_norm;
    loss = o->loss;
  } else {
    absl::StatusOr<double> total = ExchangeNorms(step, exec_->SquaredGradNorm());
    if (!total.ok()) return total.status();
    norm = std::sqrt(*total);
    if (absl::Status s = exec_->Step(opt_.optimizer.ClipFactor(norm)); !s.ok()) return s;
  }

  StepResult r;
  r.step = static_cast<int64_t>(step);
  r.loss = loss;
  r.grad_norm = norm;
  r.receive_wait = receive_wait_;
  r.compute = exec_->TakeComputeTimes();
  const int64_t done = exec_->step();
  if (!checkpoint_.path.empty() &&
      ((checkpoint_.interval > 0 && done % checkpoint_.interval == 0) || done == checkpoint_.total_steps)) {
    const absl::Time t0 = absl::Now();
    const TensorFile sync_state = sync_ != nullptr ? sync_->CheckpointState() : TensorFile();
    if (absl::Status s = exec_->SaveCheckpoint(checkpoint_.path, &sync_state); !s.ok()) return s;
    r.checkpointed = true;
    r.checkpoint_time = absl::Now() - t0;
  }
  return r;
}

absl::Status StageLoop::Finish() {
  // Both, whatever the first says: the other neighbour still needs everything queued for it.
  absl::Status first;
  for (const LinkFan* f : {&next_, &prev_}) {
    for (const LinkFan::Member& m : f->members()) {
      if (absl::Status s = m.link->Finish(); !s.ok() && first.ok()) first = s;
    }
  }
  return first;
}

}  // namespace longhaul::stage_runtime
