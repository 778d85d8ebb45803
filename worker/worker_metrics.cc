#include "worker/worker_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#ifdef LONGHAUL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace longhaul::worker {
namespace {

template <typename Builder>
auto& Build(Builder b, prometheus::Registry& r, const char* name, const char* help) {
  return b.Name(name).Help(help).Register(r);
}

// Step times from 10 ms to about 20 min (x2 per bucket): small CPU test models to large models on
// slow links.
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* b = [] {
    auto* v = new prometheus::Histogram::BucketBoundaries;
    for (double t = 0.01; t < 1500; t *= 2) v->push_back(t);
    return v;
  }();
  return *b;
}

// Relative L2 errors: fp16/bf16 around 1e-3, int8 ~1e-2, int4 ~0.1, int2 ~0.3.
const prometheus::Histogram::BucketBoundaries& ErrorBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0003, 0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0};
  return *b;
}

}  // namespace

void SetReceived(LinkStepSample& ls, const DecodeTarget& from, std::string codec) {
  ls.received_codec = std::move(codec);
  // Frames from the next stage are gradients (backward), from the previous one activations.
  ls.decode_seconds = from.times == nullptr ? 0.0 : from.times->seconds(/*forward=*/ls.direction != "forward");
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : wire_bytes_(Build(prometheus::BuildCounter(), r, "longhaul_link_wire_bytes_total",
                        "Bytes of encoded frames sent on the link (what crosses the network, before chunk headers)")),
      raw_bytes_(Build(prometheus::BuildCounter(), r, "longhaul_link_raw_bytes_total",
                       "fp32 bytes of the tensors sent on the link (what an uncompressed link would carry)")),
      frames_(Build(prometheus::BuildCounter(), r, "longhaul_link_frames_total", "Frames sent on the link")),
      send_blocked_(Build(prometheus::BuildCounter(), r, "longhaul_link_send_blocked_seconds_total",
                          "Time the stage's compute thread was blocked in Send on the link's full queue")),
      shaper_wait_(Build(prometheus::BuildCounter(), r, "longhaul_link_shaper_wait_seconds_total",
                         "Time the link's sender waited for its in-process shaper or pacer (links.rate_mbit or pace_mbit)")),
      queue_depth_(Build(prometheus::BuildGauge(), r, "longhaul_link_send_queue_depth",
                         "Messages queued on the link and not yet written, at the end of the last step")),
      rate_limit_(Build(prometheus::BuildGauge(), r, "longhaul_link_rate_limit_bytes_per_second",
                        "Configured rate of the link (links.rate_mbit, or the senders' links.pace_mbit); no series for an unlimited link")),
      error_(Build(prometheus::BuildGauge(), r, "longhaul_link_quantization_error_ratio",
                   "Mean relative L2 error ||x - dec(enc(x))|| / ||x|| of the frames measured during the last "
                   "step (the encoder samples the real tensors)")),
      error_hist_(Build(prometheus::BuildHistogram(), r, "longhaul_link_step_quantization_error_ratio",
                        "Per step, the mean relative L2 error of the frames measured in that step")),
      step_time_(Build(prometheus::BuildHistogram(), r, "longhaul_stage_step_duration_seconds",
                       "Wall time of the stage's training steps")),
      steps_(Build(prometheus::BuildCounter(), r, "longhaul_stage_steps_total", "Training steps the stage completed")),
      receive_wait_(Build(prometheus::BuildCounter(), r, "longhaul_stage_receive_wait_seconds_total",
                          "Time the stage was blocked waiting for a neighbour's message (the pipeline bubble "
                          "and the links)")),
      compute_(Build(prometheus::BuildCounter(), r, "longhaul_stage_compute_seconds_total",
                     "Compute time of the stage by phase: forward, backward (its micro-batches) and optimizer "
                     "(clipping and AdamW); wall time on the CPU, GPU time between CUDA events on a GPU")),
      encode_(Build(prometheus::BuildCounter(), r, "longhaul_link_encode_seconds_total",
                    "Time the link's encoder spent encoding the frames sent (from a ready input to the frame's "
                    "bytes on the host)")),
      decode_(Build(prometheus::BuildCounter(), r, "longhaul_link_decode_seconds_total",
                    "Time this stage spent decoding the frames it received from the peer (host time of the "
                    "decode; the kernels of a GPU decode are not in it)")),
      dp_bytes_(Build(prometheus::BuildCounter(), r, "longhaul_dp_sync_bytes_total",
                      "Replicated stages: bytes this replica sent to the stage's other replicas in the "
                      "data-parallel synchronisation (kind=wire: the codec's message payloads; kind=raw: the "
                      "same messages as fp32)")),
      dp_seconds_(Build(prometheus::BuildCounter(), r, "longhaul_dp_sync_seconds_total",
                        "Replicated stages: wall time this replica spent in the data-parallel synchronisation "
                        "(gradients, the sharded optimizer's step, weights)")),
      gpu_allocated_(Build(prometheus::BuildGauge(), r, "longhaul_gpu_memory_allocated_bytes",
                           "GPU memory in tensors (CUDA caching allocator, this process), at the end of the "
                           "last step")),
      gpu_reserved_(Build(prometheus::BuildGauge(), r, "longhaul_gpu_memory_reserved_bytes",
                          "GPU memory the CUDA caching allocator holds (allocated plus cached), at the end of "
                          "the last step")),
      gpu_max_allocated_(Build(prometheus::BuildGauge(), r, "longhaul_gpu_memory_max_allocated_bytes",
                               "Peak GPU memory in tensors since the process started (CUDA caching "
                               "allocator)")) {}

template <typename T>
T& WorkerMetrics::Series(prometheus::Family<T>& f, uint64_t job, const prometheus::Labels& labels) {
  T& m = f.Add(labels);
  if (seen_.insert(&m).second) removers_[job].emplace_back(&m, [&f, &m] { f.Remove(&m); });
  return m;
}

prometheus::Histogram& WorkerMetrics::HistogramSeries(prometheus::Family<prometheus::Histogram>& f, uint64_t job,
                                                      const prometheus::Labels& labels,
                                                      const prometheus::Histogram::BucketBoundaries& buckets) {
  prometheus::Histogram& m = f.Add(labels, buckets);
  if (seen_.insert(&m).second) removers_[job].emplace_back(&m, [&f, &m] { f.Remove(&m); });
  return m;
}

void WorkerMetrics::Track(uint64_t job) {
  if (std::find(jobs_.begin(), jobs_.end(), job) != jobs_.end()) return;
  jobs_.push_back(job);
  while (jobs_.size() > kJobsKept) {
    const uint64_t old = jobs_.front();
    jobs_.pop_front();
    for (auto& [series, remove] : removers_[old]) {
      remove();
      seen_.erase(series);  // the address may be reused by a new series
    }
    removers_.erase(old);
    for (auto it = last_.begin(); it != last_.end();) it = std::get<0>(it->first) == old ? last_.erase(it) : std::next(it);
    for (auto it = last_decode_.begin(); it != last_decode_.end();) {
      it = std::get<0>(it->first) == old ? last_decode_.erase(it) : std::next(it);
    }
  }
}

void WorkerMetrics::RecordGpuMemory() {
#ifdef LONGHAUL_WITH_CUDA
  const int n = static_cast<int>(c10::cuda::device_count());
  for (int d = 0; d < n; ++d) {
    try {
      // Index 0 is the aggregate over the allocator's pools (StatType::AGGREGATE; the enum moved
      // namespaces between LibTorch versions, the index did not).
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d);
      if (st.reserved_bytes[0].peak <= 0) continue;  // a device this process never allocated on
      const prometheus::Labels labels{{"gpu", absl::StrCat(d)}};
      gpu_allocated_.Add(labels).Set(static_cast<double>(st.allocated_bytes[0].current));
      gpu_reserved_.Add(labels).Set(static_cast<double>(st.reserved_bytes[0].current));
      gpu_max_allocated_.Add(labels).Set(static_cast<double>(st.allocated_bytes[0].peak));
    } catch (const c10::Error&) {
      // The allocator is not initialised for this device (or not LibTorch's): nothing to report.
    }
  }
#endif
}

void WorkerMetrics::RecordStep(const StageStepSample& s) {
  absl::MutexLock l(&mu_);
  Track(s.job_id);
  const std::string job = absl::StrCat(s.job_id), stage = absl::StrCat(s.stage);
  const prometheus::Labels stage_labels{{"job_id", job}, {"stage", stage}};
  HistogramSeries(step_time_, s.job_id, stage_labels, StepBuckets()).Observe(s.step_seconds);
  Series(steps_, s.job_id, stage_labels).Increment();
  Series(receive_wait_, s.job_id, stage_labels).Increment(std::max(0.0, s.receive_wait_seconds));
  for (const auto& [phase, took] : {std::pair<const char*, absl::Duration>{"forward", s.compute.forward},
                                    {"backward", s.compute.backward},
                                    {"optimizer", s.compute.optimizer}}) {
    prometheus::Labels labels = stage_labels;
    labels["phase"] = phase;
    Series(compute_, s.job_id, labels).Increment(std::max(0.0, absl::ToDoubleSeconds(took)));
  }
  if (!s.dp_codec.empty()) {
    prometheus::Labels labels = stage_labels;
    labels["codec"] = s.dp_codec;
    Series(dp_seconds_, s.job_id, labels).Increment(std::max(0.0, s.dp_seconds));
    labels["kind"] = "wire";
    Series(dp_bytes_, s.job_id, labels).Increment(static_cast<double>(std::max<int64_t>(0, s.dp_bytes)));
    labels["kind"] = "raw";
    Series(dp_bytes_, s.job_id, labels).Increment(static_cast<double>(std::max<int64_t>(0, s.dp_raw_bytes)));
  }
  for (const LinkStepSample& ls : s.links) {
    const prometheus::Labels labels{{"job_id", job},
                                    {"stage", stage},
                                    {"peer", ls.peer},
                                    {"direction", ls.direction},
                                    {"codec", ls.codec}};
    stage_runtime::LinkStats& last = last_[{s.job_id, s.stage, ls.direction, ls.peer}];
    const stage_runtime::LinkStats& now = ls.stats;
    Series(wire_bytes_, s.job_id, labels).Increment(static_cast<double>(std::max<int64_t>(0, now.wire_bytes - last.wire_bytes)));
    Series(raw_bytes_, s.job_id, labels).Increment(static_cast<double>(std::max<int64_t>(0, now.raw_bytes - last.raw_bytes)));
    Series(frames_, s.job_id, labels).Increment(static_cast<double>(std::max<int64_t>(0, now.frames - last.frames)));
    Series(shaper_wait_, s.job_id, labels)
        .Increment(std::max(0.0, now.shaper_wait_seconds - last.shaper_wait_seconds));
    Series(send_blocked_, s.job_id, labels).Increment(std::max(0.0, ls.send_blocked_seconds));
    Series(encode_, s.job_id, labels).Increment(std::max(0.0, now.encode_seconds - last.encode_seconds));
    if (!ls.received_codec.empty()) {
      // The frames of the opposite direction, from the same peer, decoded here.
      double& last_decode = last_decode_[{s.job_id, s.stage, ls.direction, ls.peer}];
      const prometheus::Labels received{{"job_id", job},
                                        {"stage", stage},
                                        {"peer", ls.peer},
                                        {"direction", ls.direction == "forward" ? "backward" : "forward"},
                                        {"codec", ls.received_codec}};
      Series(decode_, s.job_id, received).Increment(std::max(0.0, ls.decode_seconds - last_decode));
      last_decode = ls.decode_seconds;
    }
    Series(queue_depth_, s.job_id, labels).Set(static_cast<double>(ls.queue_depth));
    if (ls.rate_limit_bytes_per_second > 0) {
      Series(rate_limit_, s.job_id, labels).Set(ls.rate_limit_bytes_per_second);
    }
    const int64_t samples = now.error_samples - last.error_samples;
    if (samples > 0) {  // only links whose frames were measured have error series
      const double mean = (now.sum_rel_error - last.sum_rel_error) / static_cast<double>(samples);
      Series(error_, s.job_id, labels).Set(mean);
      HistogramSeries(error_hist_, s.job_id, labels, ErrorBuckets()).Observe(mean);
    }
    last = now;
  }
  RecordGpuMemory();
}

}  // namespace longhaul::worker
