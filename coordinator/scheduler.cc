#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace longhaul::coordinator {
namespace {

std::string Workers(int n) { return absl::StrCat(n, n == 1 ? " worker" : " workers"); }

}  // namespace

QueuePlan PlanQueue(const std::vector<QueuedJob>& queue, const std::vector<uint64_t>& idle, int live,
                    absl::Time now, const QueueOptions& options) {
  QueuePlan plan;
  size_t next_idle = 0;       // idle[next_idle..] are still free
  uint64_t reservation = 0;   // the job holding back everything after it, once there is one
  // Jobs that wait for idle workers; their reason names the idle count after this pass.
  std::vector<std::pair<uint64_t, int>> short_of_idle;
  for (const QueuedJob& j : queue) {
    if (reservation != 0) {
      plan.waiting[j.id] = absl::StrCat("held behind job ", reservation, ", which has waited longer than ",
                                        absl::FormatDuration(options.reserve_after),
                                        " and has the first claim on idle workers");
      continue;
    }
    if (j.workers <= static_cast<int>(idle.size() - next_idle)) {
      QueuePlan::Start s;
      s.job_id = j.id;
      s.workers.assign(idle.begin() + static_cast<std::ptrdiff_t>(next_idle),
                       idle.begin() + static_cast<std::ptrdiff_t>(next_idle) + j.workers);
      next_idle += static_cast<size_t>(j.workers);
      plan.start.push_back(std::move(s));
      continue;
    }
    if (j.workers > live) {
      // Reserving for it would stop the queue until more workers register, perhaps forever.
      plan.waiting[j.id] = absl::StrCat("needs ", Workers(j.workers), ", only ", live,
                                        " live (waiting for more workers to register)");
      continue;
    }
    if (now - j.queued_at >= options.reserve_after) reservation = j.id;
    short_of_idle.emplace_back(j.id, j.workers);
  }
  const size_t idle_left = idle.size() - next_idle;
  for (const auto& [id, workers] : short_of_idle) {
    std::string why = absl::StrCat("waiting for ", workers, " idle ", workers == 1 ? "worker" : "workers", ", ",
                                   idle_left, " idle");
    if (id == reservation) {
      absl::StrAppend(&why, "; waited longer than ", absl::FormatDuration(options.reserve_after),
                      ", so jobs submitted after it wait for it");
    }
    plan.waiting[id] = std::move(why);
  }
  return plan;
}

absl::Status PeerRateLimiter::Take(const std::string& grpc_peer) {
  if (limit_.per_second <= 0) return absl::OkStatus();
  const std::string host = PeerHost(grpc_peer);
  const absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  std::string key = host;
  if (buckets_.size() >= kMaxTracked && buckets_.count(host) == 0) {
    if (now - swept_ >= absl::Seconds(1)) {
      swept_ = now;
      for (auto it = buckets_.begin(); it != buckets_.end();) {
        const double refilled = it->second.tokens + absl::ToDoubleSeconds(now - it->second.at) * limit_.per_second;
        it = refilled >= limit_.burst ? buckets_.erase(it) : std::next(it);
      }
    }
    if (buckets_.size() >= kMaxTracked) key = "(hosts past the table's bound)";
  }
  auto [it, fresh] = buckets_.try_emplace(key);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = limit_.burst;
    b.at = now;
  }
  b.tokens = std::min(limit_.burst, b.tokens + absl::ToDoubleSeconds(now - b.at) * limit_.per_second);
  b.at = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  refusals_.Warn(key, absl::StrCat("limit hit: ", what_, " from ", host, " (", grpc_peer, ") over ", limit_.burst,
                                    " at once, then ", limit_.per_second, "/s; refused"));
  const double wait = (1 - b.tokens) / limit_.per_second;
  return absl::ResourceExhaustedError(absl::StrCat("too many ", what_, " from ", host, ": the limit is ", limit_.burst,
                                                   " at once, then ", limit_.per_second, " per second; try again in ",
                                                   absl::FormatDuration(absl::Ceil(absl::Seconds(wait), absl::Milliseconds(1)))));
}

}  // namespace longhaul::coordinator
