// Display names of job and worker states, and which job states are final. Header-only over the
// generated proto types, so longhaulctl uses them without linking the coordinator.
#ifndef LONGHAUL_COORDINATOR_STATES_H_
#define LONGHAUL_COORDINATOR_STATES_H_

#include "longhaul/v1/control_plane.pb.h"

namespace longhaul::coordinator {

inline const char* JobStateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_PENDING: return "PENDING";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    case v1::JOB_STATE_RECOVERING: return "RECOVERING";
    default: return "UNKNOWN";
  }
}

inline const char* WorkerStateName(v1::WorkerState s) {
  switch (s) {
    case v1::WORKER_STATE_IDLE: return "IDLE";
    case v1::WORKER_STATE_BUSY: return "BUSY";
    case v1::WORKER_STATE_DEAD: return "DEAD";
    default: return "UNKNOWN";
  }
}

// Succeeded, failed or cancelled: the job's workers are released and its status no longer changes.
inline bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_STATES_H_
