// Metrics end to end: a short job on a local cluster (real processes on loopback), then every
// daemon's /metrics scraped over HTTP and checked for the key series with sane values, each scrape
// checked by `promtool check metrics` (skipped, saying so, where promtool is not installed), and
// the coordinator's service discovery (/sd) checked to list every worker's endpoint.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

constexpr int kSteps = 5;
constexpr double kRateMbit = 400;

std::string Spec() {
  return absl::StrCat(R"(name: metrics
model: {layers: 3, hidden: 64, heads: 4, context: 32}
stages: 3
schedule: 1f1b
micro_batches: 4
micro_batch_size: 4
codecs: {forward: "int4", backward: "int8"}
steps: )", kSteps, R"(
seed: 3
links: {rate_mbit: )", kRateMbit, "}\n");
}

struct Sample {
  std::string labels;  // the {...} part, "" when none
  double value = 0;
};

// The samples of `name` in a text-format scrape (exact name: a histogram's _bucket lines are other
// names).
std::vector<Sample> Samples(const std::string& text, const std::string& name) {
  std::vector<Sample> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (series.substr(0, brace) != name) continue;
    Sample s;
    s.labels = brace == absl::string_view::npos ? "" : std::string(series.substr(brace));
    if (!absl::SimpleAtod(line.substr(space + 1), &s.value)) continue;
    out.push_back(s);
  }
  return out;
}

// Runs promtool's linter over a scrape; "" when fine or when promtool is missing (*skipped set).
std::string Promtool(const std::string& dir, const std::string& who, const std::string& scrape, bool* skipped) {
  const char* env = std::getenv("LONGHAUL_PROMTOOL");
  std::string promtool = env != nullptr ? env : "";
  if (promtool.empty()) {
    auto [rc, out] = Cluster::Run("command -v promtool");
    if (rc != 0) {
      *skipped = true;
      return "";
    }
    promtool = std::string(absl::StripTrailingAsciiWhitespace(out));
  }
  const std::string file = absl::StrCat(dir, "/", who, ".prom");
  std::ofstream(file) << scrape;
  auto [rc, out] = Cluster::Run(absl::StrCat(promtool, " check metrics < ", file));
  return rc == 0 ? "" : absl::StrCat(who, ": promtool check metrics exit ", rc, ":\n", out);
}

class MetricsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  Cluster c_;
};

TEST_F(MetricsTest, DaemonsExportMetricsAndDiscovery) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_FALSE(c_.metrics_address().empty()) << "the coordinator wrote no metrics port";
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(3));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  const std::string job_label = absl::StrCat("job_id=\"", *job, "\"");

  // Discovery: one target group per worker, at the address it registered.
  absl::StatusOr<std::vector<v1::WorkerStatus>> workers = c_.Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 3u);
  absl::StatusOr<std::string> sd_text = Cluster::HttpGet(c_.metrics_address(), "/sd");
  ASSERT_TRUE(sd_text.ok()) << sd_text.status();
  const nlohmann::json sd = nlohmann::json::parse(*sd_text);
  std::map<std::string, std::string> targets;  // worker -> target
  for (const nlohmann::json& g : sd) {
    ASSERT_EQ(g["targets"].size(), 1u) << g.dump();
    targets[g["labels"]["worker"].get<std::string>()] = g["targets"][0].get<std::string>();
  }
  for (const v1::WorkerStatus& w : *workers) {
    ASSERT_FALSE(w.info().metrics_address().empty()) << w.info().name();
    EXPECT_EQ(targets[w.info().name()], w.info().metrics_address()) << *sd_text;
  }

  bool skipped = false;
  // Workers: per link and per stage series.
  double wire = 0;
  int error_series = 0;
  for (const v1::WorkerStatus& w : *workers) {
    const std::string& name = w.info().name();
    absl::StatusOr<std::string> text = Cluster::HttpGet(w.info().metrics_address(), "/metrics");
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    EXPECT_EQ(Promtool(c_.dir(), name, *text, &skipped), "");
    const std::vector<Sample> rss = Samples(*text, "longhaul_process_resident_memory_bytes");
    ASSERT_EQ(rss.size(), 1u) << name;
    EXPECT_GT(rss[0].value, 1e6) << name;
    const std::vector<Sample> steps = Samples(*text, "longhaul_stage_steps_total");
    ASSERT_EQ(steps.size(), 1u) << name << "\n" << *text;
    EXPECT_TRUE(absl::StrContains(steps[0].labels, job_label)) << steps[0].labels;
    EXPECT_EQ(steps[0].value, kSteps) << name;
    ASSERT_EQ(Samples(*text, "longhaul_stage_step_duration_seconds_count").size(), 1u) << name;
    EXPECT_EQ(Samples(*text, "longhaul_stage_step_duration_seconds_count")[0].value, kSteps);
    const std::vector<Sample> link_wire = Samples(*text, "longhaul_link_wire_bytes_total");
    EXPECT_GE(link_wire.size(), 1u) << name;  // the middle stage sends both ways
    for (const Sample& s : link_wire) {
      EXPECT_GT(s.value, 0) << name << s.labels;
      wire += s.value;
      EXPECT_TRUE(absl::StrContains(s.labels, "codec=\"int")) << s.labels;
    }
    for (const Sample& s : Samples(*text, "longhaul_link_raw_bytes_total")) EXPECT_GT(s.value, 0) << s.labels;
    for (const Sample& s : Samples(*text, "longhaul_link_frames_total")) EXPECT_GE(s.value, kSteps * 4) << s.labels;
    for (const Sample& s : Samples(*text, "longhaul_link_rate_limit_bytes_per_second")) {
      EXPECT_EQ(s.value, kRateMbit * 1e6 / 8) << s.labels;
    }
    EXPECT_EQ(Samples(*text, "longhaul_link_rate_limit_bytes_per_second").size(), link_wire.size()) << name;
    for (const Sample& s : Samples(*text, "longhaul_link_quantization_error_ratio")) {
      ++error_series;
      EXPECT_GT(s.value, 0) << s.labels;  // int4 and int8 are lossy
      EXPECT_LE(s.value, 1) << s.labels;
    }
    EXPECT_EQ(Samples(*text, "longhaul_link_send_queue_depth").size(), link_wire.size()) << name;
    // Compute by phase, and per link the encode of what it sent and the decode of what it got.
    const std::vector<Sample> compute = Samples(*text, "longhaul_stage_compute_seconds_total");
    EXPECT_EQ(compute.size(), 3u) << name;  // forward, backward, optimizer
    for (const Sample& s : compute) EXPECT_GT(s.value, 0) << name << s.labels;
    const std::vector<Sample> encode = Samples(*text, "longhaul_link_encode_seconds_total");
    EXPECT_EQ(encode.size(), link_wire.size()) << name;
    for (const Sample& s : encode) EXPECT_GT(s.value, 0) << name << s.labels;
    const std::vector<Sample> decode = Samples(*text, "longhaul_link_decode_seconds_total");
    EXPECT_EQ(decode.size(), link_wire.size()) << name;  // every link this stage sends on, it receives on
    for (const Sample& s : decode) {
      EXPECT_GT(s.value, 0) << name << s.labels;
      // Labelled with the decoded frames' direction and codec.
      EXPECT_TRUE(absl::StrContains(s.labels, "direction=\"forward\"") == absl::StrContains(s.labels, "codec=\"int4\""))
          << s.labels;
    }
    // GPU memory exactly where the worker computes on a GPU (the local cluster's are CPU workers).
    EXPECT_EQ(Samples(*text, "longhaul_gpu_memory_allocated_bytes").empty(), w.info().device() == "cpu") << name;
  }
  EXPECT_GT(wire, 0);
  EXPECT_GE(error_series, 1);

  // Coordinator: the job's series and every worker's.
  absl::StatusOr<std::string> text = Cluster::HttpGet(c_.metrics_address(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Promtool(c_.dir(), "coordinator", *text, &skipped), "");
  auto one = [&](const std::string& name, const std::string& with) -> double {
    for (const Sample& s : Samples(*text, name)) {
      if (absl::StrContains(s.labels, with)) return s.value;
    }
    ADD_FAILURE() << "no " << name << " with " << with << " in\n" << *text;
    return -1;
  };
  EXPECT_EQ(one("longhaul_job_step", job_label), kSteps);
  EXPECT_GT(one("longhaul_job_loss", job_label), 0);
  EXPECT_GT(one("longhaul_job_tokens_per_second", job_label), 0);
  EXPECT_EQ(one("longhaul_job_state", absl::StrCat(job_label, ",state=\"succeeded\"")), 1);
  EXPECT_EQ(one("longhaul_job_state", absl::StrCat(job_label, ",state=\"running\"")), 0);
  EXPECT_EQ(one("longhaul_job_restarts_total", job_label), 0);
  for (const v1::WorkerStatus& w : *workers) {
    const std::string label = absl::StrCat("worker=\"", w.info().name(), "\"");
    const double age = one("longhaul_worker_heartbeat_age_seconds", label);
    EXPECT_GE(age, 0);
    EXPECT_LT(age, 3);  // the cluster's heartbeat timeout
    EXPECT_EQ(one("longhaul_worker_state", absl::StrCat("state=\"idle\",", label)), 1);
  }
  EXPECT_GT(one("longhaul_process_resident_memory_bytes", ""), 1e6);
  if (skipped) std::printf("note: promtool not found (Debian's prometheus package); promtool checks skipped\n");
}

}  // namespace
}  // namespace longhaul::cluster
