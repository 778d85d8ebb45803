#include "stage_runtime/stage_loop.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::stage_runtime {

std::string StageCheckpointPath(const std::string& dir, int stage) {
  return absl::StrCat(dir, "/stage-", stage, ".safetensors");
}

StageLoop::StageLoop(const PipelineOptions& options, int stage, StageExecutor* executor, Link* prev, Link* next,
                     CheckpointPolicy checkpoint)
    : opt_(options),
      stage_(stage),
      first_(stage == 0),
      last_(stage == options.stages - 1),
      exec_(executor),
      prev_(prev),
      next_(next),
      checkpoint_(std::move(checkpoint)),
      ops_(StageSchedule(options.schedule, stage, options.stages, options.micro_batches)) {}

void StageLoop::Cancel(absl::Status why) {
  {
    absl::MutexLock l(&mu_);
    if (!cancelled_.ok()) return;
    cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
  }
  for (Link* l : {prev_, next_}) {
    if (l != nullptr) l->Abort(why.ok() ? absl::CancelledError("cancelled") : why);
  }
  if (sync_ != nullptr) sync_->Abort(why.ok() ? absl::CancelledError("cancelled") : why);
}

absl::Status StageLoop::Cancelled() {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

absl::StatusOr<LinkMessage> StageLoop::Expect(Link& from, uint64_t step, int micro_batch, MessageKind kind) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<LinkMessage> m = from.Receive(kReceiveTimeout);
  receive_wait_ += absl::Now() - t0;
  if (!m.ok()) return m.status();
  if (m->step != step || m->kind != kind || (CarriesTensor(kind) && m->micro_batch != micro_batch) ||
      CarriesTensor(kind) != m->tensor.defined()) {
    return absl::DataLossError(absl::StrCat("out-of-order message from ", from.peer(), ": expected ",
                                            MessageKindName(kind), " for step ", step, " micro-batch ", micro_batch,
                                            ", got ", MessageKindName(m->kind), " for step ", m->step,
                                            " micro-batch ", m->micro_batch));
  }
  return m;
}

// Partial sums of squared norms travel down the backward chain, the total back up; every stage
// ends with the same total.
absl::StatusOr<double> StageLoop::ExchangeNorms(uint64_t step, double sq) {
  if (!last_) {
    absl::StatusOr<LinkMessage> m = Expect(*next_, step, 0, MessageKind::kNormPartial);
    if (!m.ok()) return m.status();
    sq += m->value;
  }
  double total = sq;
  if (!first_) {
    if (absl::Status s = prev_->Send(ValueMessage(step, MessageKind::kNormPartial, sq), false); !s.ok()) return s;
    absl::StatusOr<LinkMessage> m = Expect(*prev_, step, 0, MessageKind::kNormTotal);
    if (!m.ok()) return m.status();
    total = m->value;
  }
  if (!last_) {
    if (absl::Status s = next_->Send(ValueMessage(step, MessageKind::kNormTotal, total), false); !s.ok()) return s;
  }
  return total;
}

absl::StatusOr<StepResult> StageLoop::Step(const std::vector<Batch>& batches) {
  const int M = opt_.micro_batches;
  if ((first_ || last_) && static_cast<int>(batches.size()) != M) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage_, " needs ", M, " micro-batches, got ",
                                                   batches.size()));
  }
  if ((!first_ && prev_ == nullptr) || (!last_ && next_ == nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat("stage ", stage_, " is missing a link to a neighbour"));
  }
  const uint64_t step = static_cast<uint64_t>(exec_->step());
  receive_wait_ = absl::ZeroDuration();
  double loss_sum = 0;
  for (const PipelineOp& op : ops_) {
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    // The round-trip error is sampled on one micro-batch per step: it costs a decode.
    const bool measure = op.micro_batch == 0;
    if (op.forward) {
      torch::Tensor in = first_ ? batches[op.micro_batch].tokens : torch::Tensor();
      if (!first_) {
        absl::StatusOr<LinkMessage> m = Expect(*prev_, step, op.micro_batch, MessageKind::kActivation);
        if (!m.ok()) return m.status();
        in = std::move(m->tensor);
      }
      absl::StatusOr<torch::Tensor> out =
          exec_->Forward(op.micro_batch, in, last_ ? batches[op.micro_batch].labels : torch::Tensor());
      if (!out.ok()) return out.status();
      if (last_) {
        loss_sum += out->item<double>();
        continue;
      }
      const LinkMessage m = TensorMessage(step, op.micro_batch, MessageKind::kActivation, out->detach());
      if (absl::Status s = next_->Send(m, measure); !s.ok()) return s;
    } else {
      torch::Tensor g;
      if (!last_) {
        absl::StatusOr<LinkMessage> m = Expect(*next_, step, op.micro_batch, MessageKind::kGradient);
        if (!m.ok()) return m.status();
        g = std::move(m->tensor);
      }
      absl::StatusOr<torch::Tensor> gin = exec_->Backward(op.micro_batch, g);
      if (!gin.ok()) return gin.status();
      if (first_) continue;
      const LinkMessage m = TensorMessage(step, op.micro_batch, MessageKind::kGradient, gin->detach());
      if (absl::Status s = prev_->Send(m, measure); !s.ok()) return s;
    }
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
  for (Link* l : {next_, prev_}) {
    if (l == nullptr) continue;
    if (absl::Status s = l->Finish(); !s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace longhaul::stage_runtime
