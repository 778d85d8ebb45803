// The worker's Prometheus metrics: per link and per stage, updated once per step from what the
// stage runner already measures (LinkStats, the inboxes' DecodeTimes, the step's timings): the
// data plane only accumulates durations and counts. Names and labels are listed in
// docs/observability.md.
//
//   WorkerMetrics m(*common::MetricsRegistry());
//   m.RecordStep(sample);   // by the stage's compute thread, after each step
//
// Labels: job_id (not `job`, which Prometheus reserves for the scrape job), stage, and per link
// peer (the neighbour worker's name), direction (forward: activations to the next stage; backward:
// gradients to the previous one) and codec (the link's codec spec). Cardinality: a worker runs one
// stage at a time; the series of the kJobsKept most recent jobs are kept (so a finished job's final
// values stay scrapeable until the next job but one records its first step), older ones are removed.
//
// GPU memory (CUDA builds): after each step, the CUDA caching allocator's figures for every device
// this process has allocated on; per process, not per job (label `gpu`, the device index; not
// `device`, which service discovery attaches to the worker's targets).
//
// Threading: RecordStep may be called from any thread (a mutex guards the bookkeeping; the
// metrics themselves are prometheus-cpp's, thread-safe, read by the metrics server's threads).
#ifndef LONGHAUL_WORKER_WORKER_METRICS_H_
#define LONGHAUL_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "stage_runtime/executor.h"
#include "stage_runtime/link.h"
#include "worker/link_receiver.h"

namespace longhaul::worker {

// One sending direction of a stage after a step.
struct LinkStepSample {
  std::string direction;  // "forward" or "backward"
  std::string peer;       // the neighbour worker's name
  std::string codec;      // the codec spec of this direction
  stage_runtime::LinkStats stats;  // cumulative since the job started
  double send_blocked_seconds = 0;  // this step: Send() blocked on a full queue
  int64_t queue_depth = 0;          // messages queued, not yet written, at the end of the step
  double rate_limit_bytes_per_second = 0;  // configured (in-process shaping); <= 0: unlimited
  // The other direction of the same link: the frames from `peer`, decoded by this stage
  // (SetReceived). No decode series while received_codec is empty.
  std::string received_codec;
  double decode_seconds = 0;  // cumulative since the job started
};

// Fills the receiving side of `ls` from the decode target of the inbox the peer's frames arrive
// in, and the codec spec of their direction (the opposite of ls.direction).
void SetReceived(LinkStepSample& ls, const DecodeTarget& from, std::string codec);

struct StageStepSample {
  uint64_t job_id = 0;
  int stage = 0;
  double step_seconds = 0;
  double receive_wait_seconds = 0;  // this step: blocked waiting for a neighbour's message
  stage_runtime::ComputeTimes compute;  // this step's (StepResult::compute)
  std::vector<LinkStepSample> links;
  // Replicated stages (worker/replica_sync.h): this step's data-parallel synchronisation among the
  // stage's replicas; no series while dp_codec is empty (an unreplicated stage).
  std::string dp_codec;
  int64_t dp_bytes = 0;      // message payloads this replica sent (gradients and weights)
  int64_t dp_raw_bytes = 0;  // the same messages as fp32
  double dp_seconds = 0;     // wall time of the synchronisation
};

class WorkerMetrics {
 public:
  static constexpr size_t kJobsKept = 2;

  explicit WorkerMetrics(prometheus::Registry& registry);

  void RecordStep(const StageStepSample& s);

 private:
  // job, stage, direction, peer: a replica may have several neighbours in a direction
  // (stage_runtime/link_fan.h).
  using LinkKey = std::tuple<uint64_t, int, std::string, std::string>;
  // The series of `job`, made on first use and remembered for removal.
  template <typename T>
  T& Series(prometheus::Family<T>& f, uint64_t job, const prometheus::Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  prometheus::Histogram& HistogramSeries(prometheus::Family<prometheus::Histogram>& f, uint64_t job,
                                         const prometheus::Labels& labels,
                                         const prometheus::Histogram::BucketBoundaries& buckets)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Track(uint64_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordGpuMemory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Counter>& wire_bytes_;
  prometheus::Family<prometheus::Counter>& raw_bytes_;
  prometheus::Family<prometheus::Counter>& frames_;
  prometheus::Family<prometheus::Counter>& send_blocked_;
  prometheus::Family<prometheus::Counter>& shaper_wait_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& rate_limit_;
  prometheus::Family<prometheus::Gauge>& error_;
  prometheus::Family<prometheus::Histogram>& error_hist_;
  prometheus::Family<prometheus::Histogram>& step_time_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& receive_wait_;
  prometheus::Family<prometheus::Counter>& compute_;
  prometheus::Family<prometheus::Counter>& encode_;
  prometheus::Family<prometheus::Counter>& decode_;
  prometheus::Family<prometheus::Counter>& dp_bytes_;
  prometheus::Family<prometheus::Counter>& dp_seconds_;
  prometheus::Family<prometheus::Gauge>& gpu_allocated_;
  prometheus::Family<prometheus::Gauge>& gpu_reserved_;
  prometheus::Family<prometheus::Gauge>& gpu_max_allocated_;

  absl::Mutex mu_;
  std::map<LinkKey, stage_runtime::LinkStats> last_ ABSL_GUARDED_BY(mu_);  // what was already counted
  std::map<LinkKey, double> last_decode_ ABSL_GUARDED_BY(mu_);             // likewise, decode seconds
  std::deque<uint64_t> jobs_ ABSL_GUARDED_BY(mu_);                        // with series, oldest first
  // Per job, its series and how to remove each.
  std::map<uint64_t, std::vector<std::pair<const void*, std::function<void()>>>> removers_ ABSL_GUARDED_BY(mu_);
  std::set<const void*> seen_ ABSL_GUARDED_BY(mu_);  // series already in removers_
};

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_WORKER_METRICS_H_
