// What both ends of a StageLink stream (data_plane.proto) agree on: chunk and frame limits, the
// stripe metadata, and how the stage runtime's message kinds travel as v1::Direction.
#ifndef LONGHAUL_WORKER_LINK_WIRE_H_
#define LONGHAUL_WORKER_LINK_WIRE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "longhaul/v1/data_plane.pb.h"
#include "stage_runtime/link.h"

namespace longhaul::worker {

namespace v1 = ::longhaul::v1;

// Largest frame a receiver accepts (a hostile frame_bytes is rejected before any allocation).
inline constexpr int64_t kDefaultMaxFrameBytes = int64_t{1} << 30;
// Chunk size on the wire (below the 4 MiB message limit set on every channel and server).
inline constexpr int64_t kChunkBytes = int64_t{1} << 20;
// A link may be striped over up to this many gRPC streams, each on its own TCP connection: the
// sender deals frame k to stream k % stripes, and the receiving inbox takes them back in turn.
// Each stream announces itself with the call metadata kStripeMetadata = "<index>/<count>".
inline constexpr int kMaxStripes = 8;
inline constexpr char kStripeMetadata[] = "longhaul-stripe";
// Every stream names the job's attempt (StageAssignment.attempt, docs/recovery.md) in this call
// metadata; absent means 0. A receiver running another attempt of the job refuses the stream.
inline constexpr char kAttemptMetadata[] = "longhaul-attempt";

// The one mapping between stage_runtime::MessageKind and the wire's v1::Direction.
inline v1::Direction ToDirection(stage_runtime::MessageKind k) {
  switch (k) {
    case stage_runtime::MessageKind::kActivation: return v1::DIRECTION_FORWARD;
    case stage_runtime::MessageKind::kGradient: return v1::DIRECTION_BACKWARD;
    case stage_runtime::MessageKind::kNormPartial: return v1::DIRECTION_NORM_PARTIAL;
    case stage_runtime::MessageKind::kNormTotal: return v1::DIRECTION_NORM_TOTAL;
  }
  return v1::DIRECTION_UNSPECIFIED;
}

// Fails on DIRECTION_UNSPECIFIED and on values this build does not know (a peer's bug or a newer
// protocol).
inline absl::StatusOr<stage_runtime::MessageKind> ToMessageKind(v1::Direction d) {
  switch (d) {
    case v1::DIRECTION_FORWARD: return stage_runtime::MessageKind::kActivation;
    case v1::DIRECTION_BACKWARD: return stage_runtime::MessageKind::kGradient;
    case v1::DIRECTION_NORM_PARTIAL: return stage_runtime::MessageKind::kNormPartial;
    case v1::DIRECTION_NORM_TOTAL: return stage_runtime::MessageKind::kNormTotal;
    default: return absl::InvalidArgumentError(absl::StrCat("unknown direction ", static_cast<int>(d)));
  }
}

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_WIRE_H_
