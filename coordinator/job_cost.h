// The cost model's view of a job spec (placement.h's JobShape) and of a measured link under the
// spec's in-process link emulation. Plain C++ (the codec core's spec parser, the layer
// partitioner), so the coordinator and longhaulctl's callers need no LibTorch.
//
//   absl::StatusOr<placement::JobShape> shape = JobShapeOf(spec);
//   placement::Link l = EffectiveLink(rtt_ms, mbit_per_s, spec.links());
//
// FLOPs per micro-batch of n = micro_batch_size x context tokens, hidden h, vocabulary V:
// each transformer block 24 n h^2 (QKV, projection, MLP) + 4 n context h (attention scores and
// values) forward, the last stage's LM head 2 n h V; training is 3x forward (backward twice the
// forward: JobShape.forward_share = 1/3). The schedule (gpipe | 1f1b) is the spec's. A stage on a worker takes its FLOPs / (the worker's benchmark GFLOP/s x
// kComputeEfficiency). Wire bytes: the codec's payload for an [n, h] fp32 tensor plus the frame
// header (codec/spec.h's parameters; docs/placement.md).
#ifndef LONGHAUL_COORDINATOR_JOB_COST_H_
#define LONGHAUL_COORDINATOR_JOB_COST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/placement.h"
#include "longhaul/v1/control_plane.pb.h"

namespace longhaul::coordinator {

// The fraction of its fp32 matrix-product benchmark (worker/compute_bench.h) a worker reaches on a
// transformer stage: small matrices, attention, layer norms and the optimizer step run slower than
// one large product. Measured on CPU workers: about 0.6 at hidden 128, 0.8 at hidden 256
// (docs/placement.md).
inline constexpr double kComputeEfficiency = 0.6;

absl::StatusOr<placement::JobShape> JobShapeOf(const v1::JobSpec& spec);

// Bytes `codec_spec` puts on the wire for a [tokens, dim] fp32 tensor, frame header included.
absl::StatusOr<double> WireBytes(const std::string& codec_spec, int64_t tokens, int64_t dim);

// A measured link as the job's data plane sees it: throughput capped by links.rate_mbit (or
// links.between_regions_mbit when the two ends' regions differ), one-way latency RTT / 2 plus
// links.delay_ms. Loss and jitter are not modelled.
placement::Link EffectiveLink(double rtt_ms, double mbit_per_s, const v1::LinkSpec& emulation,
                              const std::string& from_region = "", const std::string& to_region = "");

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_JOB_COST_H_
