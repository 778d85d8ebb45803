// The worker's metrics (worker_metrics.h) fed with step samples: counters follow the links'
// cumulative stats, the error series exist only for measured links, names follow the rule, and
// only the most recent jobs keep series.
#include "worker/worker_metrics.h"

#include <optional>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace longhaul::worker {
namespace {

StageStepSample Sample(uint64_t job, int64_t frames, int64_t error_samples, double error_sum) {
  StageStepSample s;
  s.job_id = job;
  s.stage = 0;
  s.step_seconds = 0.25;
  s.receive_wait_seconds = 0.05;
  LinkStepSample fwd;
  fwd.direction = "forward";
  fwd.peer = "w1";
  fwd.codec = "int4";
  fwd.stats.frames = frames;
  fwd.stats.wire_bytes = frames * 100;
  fwd.stats.raw_bytes = frames * 800;
  fwd.stats.error_samples = error_samples;
  fwd.stats.sum_rel_error = error_sum;
  fwd.queue_depth = 1;
  fwd.send_blocked_seconds = 0.01;
  fwd.rate_limit_bytes_per_second = 1e6;
  s.links.push_back(fwd);
  LinkStepSample bwd = fwd;  // backward: not measured, not limited
  bwd.direction = "backward";
  bwd.stats.error_samples = 0;
  bwd.stats.sum_rel_error = 0;
  bwd.rate_limit_bytes_per_second = 0;
  s.links.push_back(bwd);
  return s;
}

class WorkerMetricsTest : public ::testing::Test {
 protected:
  std::optional<double> Value(const std::string& name, const std::map<std::string, std::string>& labels) {
    for (const prometheus::MetricFamily& f : registry_->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        int matched = 0;
        for (const auto& l : m.label) matched += labels.count(l.name) && labels.at(l.name) == l.value;
        if (matched != static_cast<int>(labels.size())) continue;
        switch (f.type) {
          case prometheus::MetricType::Counter: return m.counter.value;
          case prometheus::MetricType::Histogram: return static_cast<double>(m.histogram.sample_count);
          default: return m.gauge.value;
        }
      }
    }
    return std::nullopt;
  }
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  WorkerMetrics metrics_{*registry_};
};

// A replica that streams to two replicas of the next stage (replica counts that differ between
// stages): each link's counters follow its own cumulative stats.
TEST_F(WorkerMetricsTest, TwoLinksInOneDirectionCountApart) {
  for (const int64_t frames : {2, 5}) {
    StageStepSample s = Sample(9, frames, 0, 0);
    s.links.resize(1);  // forward only
    LinkStepSample other = s.links[0];
    other.peer = "w2";
    other.stats.frames = 10 * frames;
    s.links.push_back(other);
    metrics_.RecordStep(s);
  }
  auto labels = [](const char* peer) {
    return std::map<std::string, std::string>{{"job_id", "9"}, {"direction", "forward"}, {"peer", peer}};
  };
  EXPECT_EQ(Value("longhaul_link_frames_total", labels("w1")), 5.0);
  EXPECT_EQ(Value("longhaul_link_frames_total", labels("w2")), 50.0);
}

TEST_F(WorkerMetricsTest, CountersFollowTheLinkStats) {
  metrics_.RecordStep(Sample(7, 4, 2, 0.2));
  metrics_.RecordStep(Sample(7, 8, 4, 0.6));  // cumulative stats: +4 frames, 2 samples of mean 0.2
  const std::map<std::string, std::string> fwd{{"job_id", "7"}, {"stage", "0"}, {"direction", "forward"},
                                               {"peer", "w1"}, {"codec", "int4"}};
  EXPECT_EQ(Value("longhaul_link_frames_total", fwd), 8.0);
  EXPECT_EQ(Value("longhaul_link_wire_bytes_total", fwd), 800.0);
  EXPECT_EQ(Value("longhaul_link_raw_bytes_total", fwd), 6400.0);
  EXPECT_DOUBLE_EQ(*Value("longhaul_link_send_blocked_seconds_total", fwd), 0.02);
  EXPECT_EQ(Value("longhaul_link_send_queue_depth", fwd), 1.0);
  EXPECT_EQ(Value("longhaul_link_rate_limit_bytes_per_second", fwd), 1e6);
  EXPECT_DOUBLE_EQ(*Value("longhaul_link_quantization_error_ratio", fwd), 0.2);
  EXPECT_EQ(Value("longhaul_link_step_quantization_error_ratio", fwd), 2.0);  // observations
  EXPECT_EQ(Value("longhaul_stage_steps_total", {{"job_id", "7"}}), 2.0);
  EXPECT_EQ(Value("longhaul_stage_step_duration_seconds", {{"job_id", "7"}}), 2.0);
  EXPECT_DOUBLE_EQ(*Value("longhaul_stage_receive_wait_seconds_total", {{"job_id", "7"}}), 0.1);
  // The backward link: counted, but neither measured nor limited, so no such series.
  EXPECT_EQ(Value("longhaul_link_frames_total", {{"direction", "backward"}}), 8.0);
  EXPECT_FALSE(Value("longhaul_link_quantization_error_ratio", {{"direction", "backward"}}).has_value());
  EXPECT_FALSE(Value("longhaul_link_rate_limit_bytes_per_second", {{"direction", "backward"}}).has_value());
}

// Compute by phase and the links' encode and decode times: cumulative inputs become counters; a
// decode series is labelled with the direction and codec of the frames decoded (the opposite of
// the sending link's), and exists only where the receiving side was filled in.
TEST_F(WorkerMetricsTest, ComputeEncodeAndDecodeTimes) {
  DecodeTarget from_next;  // the inbox of stage 0's backward frames (gradients from w1)
  for (int step = 1; step <= 2; ++step) {
    StageStepSample s = Sample(3, 4 * step, 0, 0);
    s.compute.forward = absl::Milliseconds(10);
    s.compute.backward = absl::Milliseconds(20);
    s.compute.optimizer = absl::Milliseconds(5);
    s.links[0].stats.encode_seconds = 0.5 * step;  // cumulative
    from_next.times->Add(stage_runtime::MessageKind::kGradient, absl::Milliseconds(300));
    SetReceived(s.links[0], from_next, "int8");
    metrics_.RecordStep(s);
  }
  const auto phase = [](const char* p) {
    return std::map<std::string, std::string>{{"job_id", "3"}, {"stage", "0"}, {"phase", p}};
  };
  EXPECT_DOUBLE_EQ(*Value("longhaul_stage_compute_seconds_total", phase("forward")), 0.02);
  EXPECT_DOUBLE_EQ(*Value("longhaul_stage_compute_seconds_total", phase("backward")), 0.04);
  EXPECT_DOUBLE_EQ(*Value("longhaul_stage_compute_seconds_total", phase("optimizer")), 0.01);
  EXPECT_DOUBLE_EQ(*Value("longhaul_link_encode_seconds_total", {{"job_id", "3"}, {"direction", "forward"}}), 1.0);
  EXPECT_DOUBLE_EQ(*Value("longhaul_link_decode_seconds_total", {{"job_id", "3"},
                                                                 {"stage", "0"},
                                                                 {"peer", "w1"},
                                                                 {"direction", "backward"},
                                                                 {"codec", "int8"}}),
                   0.6);
  // Only the link whose receiving side was filled in has a decode series.
  EXPECT_FALSE(Value("longhaul_link_decode_seconds_total", {{"direction", "forward"}}).has_value());
}

TEST_F(WorkerMetricsTest, NamesFollowTheRule) {
  StageStepSample s = Sample(1, 1, 1, 0.1);
  SetReceived(s.links[0], DecodeTarget{}, "int8");
  metrics_.RecordStep(s);
  const auto families = registry_->Collect();  // the families with series
  EXPECT_GE(families.size(), 15u);
  for (const prometheus::MetricFamily& f : families) {
    EXPECT_EQ(common::CheckMetricName(f.name, f.type), "");
    EXPECT_FALSE(f.help.empty()) << f.name;
  }
  // The GPU memory gauges have series only on GPU workers; their names by hand.
  for (const char* name : {"longhaul_gpu_memory_allocated_bytes", "longhaul_gpu_memory_reserved_bytes",
                           "longhaul_gpu_memory_max_allocated_bytes"}) {
    EXPECT_EQ(common::CheckMetricName(name, prometheus::MetricType::Gauge), "");
  }
}

TEST_F(WorkerMetricsTest, OnlyTheMostRecentJobsKeepSeries) {
  for (uint64_t job = 1; job <= WorkerMetrics::kJobsKept + 2; ++job) metrics_.RecordStep(Sample(job, 1, 1, 0.1));
  for (uint64_t job = 1; job <= WorkerMetrics::kJobsKept + 2; ++job) {
    const bool kept = job > 2;
    EXPECT_EQ(Value("longhaul_link_frames_total", {{"job_id", absl::StrCat(job)}}).has_value(), kept) << job;
    EXPECT_EQ(Value("longhaul_stage_step_duration_seconds", {{"job_id", absl::StrCat(job)}}).has_value(), kept) << job;
  }
  // A job whose series were removed starts again from zero if it ever reports again.
  metrics_.RecordStep(Sample(1, 1, 1, 0.1));
  EXPECT_EQ(Value("longhaul_link_frames_total", {{"job_id", "1"}, {"direction", "forward"}}), 1.0);
}

}  // namespace
}  // namespace longhaul::worker
