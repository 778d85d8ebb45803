// The coordinator's Prometheus metrics and its service discovery for Prometheus (docs/observability.md).
//
//   CoordinatorMetrics m(*common::MetricsRegistry(), svc);
//   server->OnScrape([&] { m.Refresh(); });
//   server->Serve("/sd", "application/json", [&] { return m.DiscoveryJson(); });
//
// Everything is read from the service at scrape time (CoordinatorService::ViewForMetrics), so the
// handlers carry no instrumentation. Per job: step, loss, tokens/s, state, restarts, labelled
// job_id (not `job`: Prometheus gives every scraped series a `job` label of its own, the scrape
// job's, and would rename ours to exported_job). Pending and running jobs and the kMaxJobs most
// recent others have series; a finished job's series are removed when newer ones push it out
// (bounded cardinality). Per stage of a job that has been placed, labelled job_id and stage: its
// compute per step, the prediction, and whether it is flagged as a straggler (docs/recovery.md).
// Per live worker: heartbeat age and state, labelled worker (its name); a
// worker's series go when it dies (longhaul_workers counts the dead).
//
// Threading: Refresh and DiscoveryJson are called by the metrics server, one request at a time.
#ifndef LONGHAUL_COORDINATOR_COORDINATOR_METRICS_H_
#define LONGHAUL_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "coordinator/coordinator.h"

namespace longhaul::coordinator {

class CoordinatorMetrics {
 public:
  // Jobs with series at any time (the most recent ones by id).
  static constexpr size_t kMaxJobs = 20;

  CoordinatorMetrics(prometheus::Registry& registry, CoordinatorService* service);

  // Sets every series from the service's current state.
  void Refresh();
  // Prometheus http_sd JSON: one target group per live worker that reported a metrics address,
  // labelled worker, region and device.
  std::string DiscoveryJson();

 private:
  void RemoveJob(const std::string& id);

  CoordinatorService* const service_;
  prometheus::Family<prometheus::Gauge>& job_info_;
  prometheus::Family<prometheus::Gauge>& job_step_;
  prometheus::Family<prometheus::Gauge>& job_loss_;
  prometheus::Family<prometheus::Gauge>& job_tokens_;
  prometheus::Family<prometheus::Gauge>& job_state_;
  prometheus::Family<prometheus::Counter>& job_restarts_;
  prometheus::Family<prometheus::Gauge>& stage_straggler_;
  prometheus::Family<prometheus::Gauge>& stage_compute_;
  prometheus::Family<prometheus::Gauge>& stage_predicted_;
  prometheus::Family<prometheus::Gauge>& worker_heartbeat_age_;
  prometheus::Family<prometheus::Gauge>& worker_state_;
  prometheus::Family<prometheus::Gauge>& workers_;
  std::set<std::string> jobs_;  // job ids with series
  std::set<std::string> worker_series_;  // names of the (live) workers with series
  std::map<std::string, std::string> job_names_;  // id -> the name in its info series
  std::map<std::string, int> job_stages_;         // id -> stages with series
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_COORDINATOR_METRICS_H_
