// What a job spec's data_parallel.codec implies beyond its codec (the codecs themselves:
// collective/data_parallel.h). The one rule for the coordinator (recovery, memory estimate) and the
// workers (what a replica's checkpoint holds).
#ifndef LONGHAUL_PROTO_DATA_PARALLEL_SPEC_H_
#define LONGHAUL_PROTO_DATA_PARALLEL_SPEC_H_

#include "absl/strings/string_view.h"

namespace longhaul {

// Whether a stage's replicas shard the optimizer state among themselves: sdp4bit and zeropp keep
// 1/N of AdamW's moments and main weights on each replica (and in its own checkpoints); fp32 and
// BitDP keep all of it on every replica.
inline bool DpCodecShardsOptimizerState(absl::string_view codec) { return codec == "sdp4bit" || codec == "zeropp"; }

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_DATA_PARALLEL_SPEC_H_
