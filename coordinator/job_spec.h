// Job specs: YAML in, a validated v1::JobSpec out. Every problem is reported, not just the first:
// the error message has one "field: problem" line per problem, so `longhaulctl submit` can show
// them all at once.
//
//   absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml_text);
//
// The YAML schema (every key optional, defaults in brackets; see deploy/jobs/demo.yaml):
//   name [job]
//   model: {preset [none], layers [4], hidden [128], heads [4], context [64], vocab [256]}
//                         preset: gpt2-small | gpt2-medium | gpt2-large | gpt2-xl sets every size
//                         (vocab 50257, context 1024); sizes given next to it override it
//   stages [4]            pipeline stages, one worker each, 1..layers
//   schedule [1f1b]       1f1b | gpipe
//   micro_batches [4], micro_batch_size [8]
//   codecs: {forward [tahquant], backward [int8]}     codec specs, see codec/spec.h
//   optimizer: {name [adamw], lr [3e-3], min_lr [3e-4], warmup_steps [20], beta1 [0.9],
//               beta2 [0.95], eps [1e-8], weight_decay [0.1], clip_norm [1.0]}
//   steps [300], seed [1]
//   checkpoint: {interval [50 steps; 0 = at the end only], dir [<worker data dir>/jobs/<id>],
//                replicate [peer]}
//                         every stage writes a checkpoint every `interval` steps (and after the last);
//                         a failure re-runs at most about one interval (docs/recovery.md). replicate:
//                         peer (each checkpoint is copied to the next stage's worker, or with one
//                         stage to the next replica's, so a stage can be restored when its machine
//                         is gone) | none
//   recovery: {max_restarts [10], wait [10m], progress_timeout_factor [10], progress_timeout_min [60s],
//              startup_timeout [30m], straggler_factor [3]}
//                         a dead worker's job restarts from the checkpoints (RECOVERING), at most
//                         max_restarts times; with no spare worker within `wait` (a duration: 0,
//                         90s, 10m) it fails naming the worker. The progress watchdog: no step for
//                         max(progress_timeout_min, progress_timeout_factor x the expected step
//                         time) (factor 0: off; else 2..10000) means a hung stage, whose worker is
//                         treated as lost; startup_timeout bounds an attempt's start (restoring,
//                         connecting). A stage computing more than straggler_factor x its
//                         prediction per step is flagged (0: never). docs/recovery.md
//   precision [fp32]      fp32 | bf16 (matrix products and attention in bf16, fp32 master weights)
//   data: {format [text], corpus [/usr/share/games/fortunes], val_fraction [0.1]}
//                         text: byte-level (vocab >= 256), corpus a file or a directory;
//                         tokens-u16: corpus a directory with train.bin and val.bin (longhaul-data
//                         prepare), every token < model.vocab; val_fraction is for text only
//   links: {rate_mbit [0 = unshaped], between_regions_mbit [0 = rate_mbit],
//           burst_bytes [0 = about 1 ms of traffic], delay_ms [0], jitter_ms [0],
//           loss [0, probability per chunk], retransmit_ms [0 = max(200, 3 x delay_ms)],
//           streams [1], codec_device [auto], pace_mbit [0 = unpaced]}
//           in-process emulation by every link's sender (netem/shaper.h); pace_mbit (not with
//           rate_mbit, delay_ms, jitter_ms or loss): not emulation but every data-plane link's
//           sender's own pace (pipeline and data-parallel) on real or tc-shaped links, set just
//           under the slowest access link so that its queue stays short (per link, not per host;
//           links between regions emulated at between_regions_mbit are not paced); between_regions_mbit:
//           the rate of links between workers of different --region (pipeline and data-parallel)
//           instead of rate_mbit (proto/link_spec.h), as longhaul-netem's between_regions; streams: gRPC streams
//           (TCP connections) each data-plane link is striped over, 1..8, for fast links (one
//           stream's threads cap a link at ~30 Gbit/s); a rate-limited link uses 1;
//           codec_device: auto | cpu | gpu, where a stage on a CUDA device encodes what it sends
//           and decodes what it receives: auto on its GPU when the worker has the GPU codecs
//           (codec/cuda/), else on the CPU after a copy; cpu always on the CPU; gpu on the GPU or
//           the stage fails saying why. Stages on the CPU use the CPU whatever it says
//   codec_threads [1]
//   replicas [1]          every stage runs on this many workers (1..64; micro_batches must be a
//                         multiple): replica r takes the step's micro-batches r*M/N .. (r+1)*M/N-1,
//                         so the global batch does not change (docs/replicated-stages.md); or a
//                         list, one count per stage ([2, 1]: stage 0 on 2 workers, stage 1 on one
//                         that takes both's micro-batches; proto/replica_layout.h)
//   data_parallel: {codec [fp32], timeout [120s], weight_bits [4]}
//                         how a stage's replicas synchronise after the backward pass: fp32 |
//                         sdp4bit | bitdp1 | bitdp2 | zeropp (collective/data_parallel.h); timeout:
//                         deadline of one synchronisation; weight_bits: sdp4bit's qWD / zeropp's
//                         qwZ bits, 4 or 8
#ifndef LONGHAUL_COORDINATOR_JOB_SPEC_H_
#define LONGHAUL_COORDINATOR_JOB_SPEC_H_

#include <algorithm>
#include <string>

#include "absl/status/statusor.h"
#include "longhaul/v1/control_plane.pb.h"
#include "proto/data_parallel_spec.h"
#include "proto/replica_layout.h"

namespace longhaul::coordinator {

inline constexpr size_t kMaxSpecBytes = 64 * 1024;

v1::JobSpec DefaultJobSpec();

// Parses and validates. steps_override > 0 replaces `steps` before validation.
absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& yaml, int64_t steps_override = 0);

// Replica counts, slots and shares of the step: proto/replica_layout.h (StageReplicas,
// WorkersNeeded, ReplicaMicroBatches, ...), shared with the workers.

// Whether `stage`'s replicas shard the optimizer state among themselves (DpCodecShardsOptimizerState).
inline bool ShardsOptimizerState(const v1::JobSpec& spec, int stage) {
  return StageReplicas(spec, stage) > 1 && DpCodecShardsOptimizerState(spec.data_parallel().codec());
}

// Checks a spec's values (used by ParseJobSpec; exposed for specs built in code). Returns every
// problem, one per line.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Whether `text` can be a YAML job spec at all: UTF-8 without NUL or other control characters
// (tab, CR and LF aside). The message names the first offending byte and its offset, so binary
// garbage gets a clear answer instead of a YAML or protobuf complaint. ParseJobSpec calls it;
// `longhaulctl submit` may call it before sending (a spec_yaml that is not UTF-8 cannot even be
// serialised as the request's string field).
absl::Status CheckSpecText(const std::string& text);

// What the largest stage of a job needs in memory on its worker, estimated from a valid spec
// before the job is accepted (the coordinator refuses a job whose stage cannot fit a worker,
// CoordinatorOptions::worker_memory_bytes). Counted: fp32 weights, gradients and AdamW's two moments
// (16 bytes a parameter whatever the precision: bf16 keeps fp32 master weights; the moments / N
// for the sharded data-parallel codecs), the activations kept for the backward pass of the
// micro-batches a stage holds at once (GPipe: all of a step; 1F1B: stages - s on stage s), per
// layer at least 16·s·b·h values at the precision's size (Korthikanti et al. 2022 without dropout
// masks and without the s² attention scores, which fused attention does not keep), and the last
// stage's logits and their gradient. Not counted: buffers, the links' frames, allocator slack,
// temporaries — so it errs low: a job refused by it cannot fit.
struct MemoryEstimate {
  int stage = 0;            // the stage that needs the most (the first of equals)
  double parameters = 0;    // its parameters
  double weight_bytes = 0;  // fp32 weights
  double gradient_bytes = 0;
  double optimizer_bytes = 0;   // AdamW's two moments
  double activation_bytes = 0;  // kept for the backward pass, logits included
  double total_bytes() const { return weight_bytes + gradient_bytes + optimizer_bytes + activation_bytes; }
  // "stage 0 of 4: 6.44e+10 parameters; weights 240 GiB + gradients 240 GiB + optimizer 480 GiB +
  // activations 12.0 GiB = 972 GiB"
  std::string ToString(int stages) const;
};
MemoryEstimate EstimateStageMemory(const v1::JobSpec& spec);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_JOB_SPEC_H_
