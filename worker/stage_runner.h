// StageRunner: runs one stage of one job on a worker — the network counterpart of
// stage_runtime::InProcessPipeline's per-stage loop.
//
// Per step it runs the schedule's forward/backward operations, taking inputs from the inboxes
// (activations from stage s-1, gradients from stage s+1) and handing outputs to the link senders;
// stage 0 samples token batches and the last stage samples the matching labels from the same
// deterministic sampler (seed, step, micro-batch), so no labels cross the network. Global gradient
// clipping needs every stage's squared gradient norm: the partial sums travel down the backward
// chain after the step's last gradient (NORM_PARTIAL), stage 0 sends the total back up the forward
// chain (NORM_TOTAL), and every stage then steps its optimizer with the same clip factor.
//
// Threading: Run() is the stage's compute thread and owns the executor. Cancel() and Inbox() may
// be called from any thread.
#ifndef LONGHAUL_WORKER_STAGE_RUNNER_H_
#define LONGHAUL_WORKER_STAGE_RUNNER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "longhaul/v1/control_plane.pb.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/pipeline.h"
#include "worker/link.h"

namespace longhaul::worker {

// Converts a job spec to the stage runtime's pipeline options (shared with tests that compare a
// networked job against the in-process pipeline).
absl::StatusOr<stage_runtime::PipelineOptions> ToPipelineOptions(const v1::JobSpec& spec);

class StageRunner {
 public:
  using ProgressFn = std::function<void(const v1::StepProgress&)>;

  // `data_dir` is the worker's data directory (checkpoints go under it unless the spec names one).
  StageRunner(v1::StageAssignment assignment, std::string data_dir, ProgressFn progress);

  // The inbox for frames sent by `from_stage`, or an error if that stage is not a neighbour.
  absl::StatusOr<std::shared_ptr<Inbox>> InboxFrom(int from_stage);

  // Runs the whole job on the calling thread; the result says how it ended.
  v1::JobFinished Run();

  // Makes Run() stop at its next wait (and tears the links down). Any thread.
  void Cancel(absl::Status why);

  uint64_t job_id() const { return a_.job_id(); }
  int stage() const { return a_.stage(); }

 private:
  absl::Status RunSteps();
  absl::Status Setup();
  absl::StatusOr<InFrame> Expect(Inbox& in, uint64_t step, int mb, v1::Direction dir);
  absl::Status CheckCancelled();

  const v1::StageAssignment a_;
  const std::string data_dir_;
  ProgressFn progress_;
  const bool first_, last_;
  std::shared_ptr<Inbox> from_prev_, from_next_;  // null at the ends
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  std::unique_ptr<LinkSender> to_next_, to_prev_;
  std::unique_ptr<stage_runtime::StageExecutor> exec_;
  std::unique_ptr<stage_runtime::TextDataset> data_;
  stage_runtime::PipelineOptions opt_;
  std::string checkpoint_path_;
  absl::Duration recv_wait_ = absl::ZeroDuration();

  absl::Mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  // The senders, published for Cancel() once Setup created them.
  LinkSender* live_senders_[2] ABSL_GUARDED_BY(mu_) = {nullptr, nullptr};
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_STAGE_RUNNER_H_
