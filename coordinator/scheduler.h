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
//
// Admission, before a job or a worker gets that far (docs/security.md, "Resource limits"): a token
// bucket per client host (PeerRateLimiter) bounds how fast one client may submit jobs or register
// workers, so one client cannot flood the queue, the state file or the registry.
#ifndef LONGHAUL_COORDINATOR_SCHEDULER_H_
#define LONGHAUL_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/peer_host.h"
#include "common/throttled_log.h"

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

// A token bucket: `burst` requests at once, refilled at `per_second`. per_second <= 0: no limit.
struct RateLimit {
  double per_second = 0;
  double burst = 0;
};

// Per-client quotas of the control plane. Defaults: generous for a person or a script submitting a
// sweep (100 jobs at once, then 2 a second) and for a host starting many workers (20 at once, then
// one a second; a worker retries a refused registration with backoff), far below a flood.
struct AdmissionLimits {
  RateLimit submit = {2, 100};
  RateLimit register_worker = {1, 20};
  RateLimit join = {1, 20};  // Join needs no certificate: the one RPC open to anyone who can connect
};

// Token buckets per client host: the host of gRPC's peer string ("ipv4:10.0.0.5:40312" ->
// "10.0.0.5"), so a client opening new connections (new ports) still draws on one bucket. A refusal
// is RESOURCE_EXHAUSTED saying the limit and when a request will be accepted again, and is logged
// with the peer (common::ThrottledLog: the first of a run, then at most every 10 s per host with the
// count refused meanwhile). Past 10,000 hosts, idle buckets (full again) are forgotten, at most one
// sweep a second; if none is idle, new hosts share one bucket, so a client with many addresses gets
// no more than the others together, and the table stays bounded. Thread-safe.
class PeerRateLimiter {
 public:
  // `what`: the requests limited, for messages ("job submissions").
  PeerRateLimiter(std::string what, RateLimit limit, common::Clock* clock)
      : what_(std::move(what)), limit_(limit), clock_(clock) {}
  absl::Status Take(const std::string& grpc_peer);
  // "ipv4:1.2.3.4:5" -> "1.2.3.4", "ipv6:[::1]:5" -> "::1", "unix:/path" -> "unix:/path".
  static std::string PeerHost(const std::string& grpc_peer) { return common::GrpcPeerHost(grpc_peer); }

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time at;  // when `tokens` was computed
  };
  static constexpr size_t kMaxTracked = 10000;
  const std::string what_;
  const RateLimit limit_;
  common::Clock* const clock_;
  common::ThrottledLog refusals_{"coordinator", absl::Seconds(10), clock_};
  absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  absl::Time swept_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_SCHEDULER_H_
