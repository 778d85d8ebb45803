// What a stage's compute thread is doing (v1::StageActivity, sent with the workers' heartbeats) in
// words: the coordinator's watchdog messages and the worker's note on a stage slow to stop.
#ifndef LONGHAUL_PROTO_STAGE_ACTIVITY_H_
#define LONGHAUL_PROTO_STAGE_ACTIVITY_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "longhaul/v1/control_plane.pb.h"

namespace longhaul {

// "waiting for stage 2 for 3.1 s", "synchronising step 14 with its replicas for 0.2 s", ...
inline std::string DescribeActivity(const v1::StageActivity& a) {
  const std::string since = absl::StrFormat(" for %.1f s", a.seconds());
  switch (a.phase()) {
    case v1::StageActivity::PHASE_SETUP:
      return absl::StrCat("setting up (building, restoring, connecting)", since);
    case v1::StageActivity::PHASE_COMPUTE:
      return absl::StrCat("computing step ", a.step() + 1, since);
    case v1::StageActivity::PHASE_RECEIVE:
      return absl::StrCat("waiting for stage ", a.peer_stage(), since);
    case v1::StageActivity::PHASE_SEND:
      return absl::StrCat("waiting to send to stage ", a.peer_stage(), since);
    case v1::StageActivity::PHASE_SYNC:
      return absl::StrCat("synchronising step ", a.step() + 1, " with its replicas", since);
    default:
      return "doing nothing it reported";
  }
}

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_STAGE_ACTIVITY_H_
