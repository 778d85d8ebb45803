// The job queue's decision, as a pure function of the queue and the workers: which pending jobs
// start now, on which workers, and why each of the others waits. The coordinator calls it on every
// state change (coordinator.h lists them) and applies the result; tests call it directly.
//
//   QueuePlan plan = PlanQueue(queue, idle_worker_ids, live_workers, clock->Now(), options);
//   for (const QueuePlan::Start& s : plan.start) ...   // s.workers[i] runs stage i
//
// The rule (one pass over the queue in submission order):
//   - A job starts when enough idle workers are left for it: the plan names the lowest-numbered
//     ones, stage i on the i-th (the naive order); the coordinator's placement may choose other
//     idle workers, and another order, from the measured links (coordinator.h, placement.h).
//   - A job that does not fit is skipped and stays pending; later jobs may still start. So a big
//     job does not hold back small ones behind it, and a job the cluster cannot run (more stages
//     than live workers) holds back nothing.
//   - Against starvation: a job that has waited at least `reserve_after` (default 10 min), does not
//     fit now and would fit on the live workers becomes a reservation: no job after it in the
//     queue starts until it has. A job that waits that long only because the workers are busy
//     therefore starts once enough of them finish, whatever was submitted after it. The first such
//     job in the queue holds everything behind it, so reservations are served in submission order.
//   - A waiting job's reason says which case it is in (shown by `longhaulctl status`).
#ifndef LONGHAUL_COORDINATOR_SCHEDULER_H_
#define LONGHAUL_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace longhaul::coordinator {

struct QueuedJob {
  uint64_t id = 0;
  int workers = 0;          // one per stage
  absl::Time queued_at;     // when it was submitted
};

struct QueueOptions {
  absl::Duration reserve_after = absl::Minutes(10);
};

struct QueuePlan {
  struct Start {
    uint64_t job_id = 0;
    std::vector<uint64_t> workers;  // stage i on workers[i]
  };
  std::vector<Start> start;                // in queue order
  std::map<uint64_t, std::string> waiting;  // every job not started -> why
};

// `queue`: the pending jobs in submission order. `idle`: ids of workers that can take a stage now,
// in the order they are preferred. `live`: workers that are not dead (idle or busy).
QueuePlan PlanQueue(const std::vector<QueuedJob>& queue, const std::vector<uint64_t>& idle, int live,
                    absl::Time now, const QueueOptions& options);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_SCHEDULER_H_
