// StageRunner's report of each step (stage_runner.h): the progress the coordinator gets (loss,
// bytes on the links, waits, a replica's synchronisation) and the sample the worker's metrics
// record, both from the step's result and the links' counters.
#include "worker/stage_runner.h"

#include "absl/time/time.h"

namespace longhaul::worker {
namespace {

// A replica's sync of one step as progress reports it.
v1::DpSyncFigures DpSyncFiguresOf(const collective::CallStats& c) {
  v1::DpSyncFigures f;
  f.set_seconds(absl::ToDoubleSeconds(c.wall));
  f.set_has_update(c.update_start != absl::InfiniteDuration());
  if (f.has_update()) {
    f.set_before_update_seconds(absl::ToDoubleSeconds(c.update_start));
    f.set_update_seconds(absl::ToDoubleSeconds(c.update));
    f.set_busiest_link_bytes_before_update(c.busiest_link_before_update());
    f.set_busiest_link_bytes_after_update(c.busiest_link_after_update());
  }
  f.set_busiest_link_bytes(c.busiest_inter_region_link());
  return f;
}

}  // namespace

v1::StepProgress StageRunner::Progress(const stage_runtime::StepResult& r, absl::Duration took,
                                      StageStepSample* sample) {
  v1::StepProgress p;
  p.set_job_id(a_.job_id());
  p.set_stage(a_.stage());
  p.set_step(r.step + 1);
  p.set_loss(r.loss);
  p.set_grad_norm(r.grad_norm);
  p.set_step_seconds(absl::ToDoubleSeconds(took - r.checkpoint_time));
  p.set_checkpoint_seconds(absl::ToDoubleSeconds(r.checkpoint_time));
  p.set_checkpointed(r.checkpointed);
  p.set_attempt(a_.attempt());
  p.set_tokens(int64_t{opt_.micro_batches} * opt_.micro_batch_size * opt_.model.context);
  int64_t wire = 0, raw = 0;
  double send_wait = 0;
  for (const std::vector<Neighbour>* side : {&next_, &prev_}) {
    const bool fwd = side == &next_;
    for (const Neighbour& n : *side) {
      GrpcLink* l = n.link.get();
      if (l == nullptr) continue;
      const stage_runtime::LinkStats st = l->stats();
      const double blocked = absl::ToDoubleSeconds(l->TakeSendWait());
      wire += st.wire_bytes;
      raw += st.raw_bytes;
      send_wait += blocked;
      LinkStepSample ls;
      ls.direction = fwd ? "forward" : "backward";
      ls.peer = n.peer.name();
      ls.codec = fwd ? opt_.forward_codec : opt_.backward_codec;
      ls.stats = st;
      ls.send_blocked_seconds = blocked;
      ls.queue_depth = static_cast<int64_t>(l->queue_depth());
      ls.rate_limit_bytes_per_second = n.rate;
      SetReceived(ls, n.inbox->decode_target(), fwd ? opt_.backward_codec : opt_.forward_codec);
      sample->links.push_back(std::move(ls));
      // Quantisation error is reported for the forward (activation) link; the loop measures it on
      // its first micro-batch, which goes to the first neighbour.
      if (fwd && &n == &next_.front()) {
        const int64_t k = st.error_samples - reported_error_samples_;
        p.set_mean_rel_error(k > 0 ? (st.sum_rel_error - reported_error_sum_) / k : 0.0);
        reported_error_samples_ = st.error_samples;
        reported_error_sum_ = st.sum_rel_error;
      }
    }
  }
  p.set_wire_bytes(wire);
  p.set_raw_bytes(raw);
  p.set_send_wait_seconds(send_wait);
  p.set_recv_wait_seconds(absl::ToDoubleSeconds(r.receive_wait));
  sample->job_id = a_.job_id();
  sample->stage = a_.stage();
  sample->step_seconds = p.step_seconds();
  sample->receive_wait_seconds = p.recv_wait_seconds();
  sample->compute = r.compute;
  if (sync_) {
    p.set_replica(a_.replica_index());
    p.set_tokens(p.tokens() * replicas_);  // the job's step: every replica's share
    p.set_dp_bytes(sync_->last().bytes_sent);
    p.set_dp_raw_bytes(sync_->last().bytes_sent_uncompressed);
    p.set_dp_seconds(absl::ToDoubleSeconds(sync_->last().wall));
    *p.mutable_dp_sync() = DpSyncFiguresOf(sync_->last());
    p.mutable_dp_sync()->set_step_seconds(p.step_seconds());
    sample->dp_codec = collective::DpCodecName(sync_->codec());
    sample->dp_bytes = p.dp_bytes();
    sample->dp_raw_bytes = p.dp_raw_bytes();
    sample->dp_seconds = p.dp_seconds();
  }
  return p;
}

}  // namespace longhaul::worker
