// Metrics: the HTTP server of common/metrics.h (port 0, /metrics, a handler of one's own, "none"),
// the naming rule, and the coordinator's export over a service driven directly with a fake clock:
// every family follows the rule, job series are bounded to the most recent jobs, and the service
// discovery JSON lists the live workers that reported a metrics address.
#include "coordinator/coordinator_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <prometheus/counter.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "tools/cluster/local_cluster.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

using common::CheckMetricName;
using prometheus::MetricType;

TEST(MetricNames, Rule) {
  EXPECT_EQ(CheckMetricName("longhaul_link_wire_bytes_total", MetricType::Counter), "");
  EXPECT_EQ(CheckMetricName("longhaul_stage_step_duration_seconds", MetricType::Histogram), "");
  EXPECT_EQ(CheckMetricName("longhaul_job_loss", MetricType::Gauge), "");
  EXPECT_NE(CheckMetricName("link_wire_bytes_total", MetricType::Counter), "");      // no prefix
  EXPECT_NE(CheckMetricName("longhaul_link_wire_bytes", MetricType::Counter), "");   // counter without _total
  EXPECT_NE(CheckMetricName("longhaul_job_step_total", MetricType::Gauge), "");      // _total on a gauge
  EXPECT_NE(CheckMetricName("longhaul_step_time_ms", MetricType::Gauge), "");        // not base units
  EXPECT_NE(CheckMetricName("longhaul_queue_mib", MetricType::Gauge), "");
  EXPECT_NE(CheckMetricName("longhaul_Job_loss", MetricType::Gauge), "");            // not snake case
}

TEST(MetricsServer, ServesMetricsAndOwnPathsOnAFreePort) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("longhaul_test_things_total").Help("things").Register(*registry).Add({{"a", "b"}}).Increment(3);
  auto server = common::MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  int refreshed = 0;
  (*server)->OnScrape([&] { ++refreshed; });
  (*server)->Serve("/sd", "application/json", [] { return std::string("[]"); });
  const std::string addr = absl::StrCat("127.0.0.1:", (*server)->port());
  absl::StatusOr<std::string> m = cluster::Cluster::HttpGet(addr, "/metrics");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(absl::StrContains(*m, "longhaul_test_things_total{a=\"b\"} 3")) << *m;
  EXPECT_EQ(refreshed, 1);
  absl::StatusOr<std::string> sd = cluster::Cluster::HttpGet(addr, "/sd");
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_EQ(*sd, "[]");
  EXPECT_FALSE(cluster::Cluster::HttpGet(addr, "/nothing").ok());
  // The server's own registry carries the process gauge.
  EXPECT_TRUE(absl::StrContains(*cluster::Cluster::HttpGet(addr, "/metrics"), "longhaul_process_resident_memory_bytes"));
  // The same address again: taken; with the fallback a free port is used and the note says so.
  EXPECT_FALSE(common::MetricsServer::Start(addr, registry).ok());
  std::string note;
  auto fallback = common::StartMetricsServer(addr, /*fallback_to_free_port=*/true, &note);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  ASSERT_NE(*fallback, nullptr);
  EXPECT_NE((*fallback)->port(), (*server)->port());
  EXPECT_TRUE(absl::StrContains(note, "taken")) << note;
  EXPECT_FALSE(common::StartMetricsServer(addr, /*fallback_to_free_port=*/false, &note).ok());
  auto none = common::StartMetricsServer("none", false, &note);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  EXPECT_EQ(common::AdvertisedAddress("0.0.0.0:9465", 9465, ""), "127.0.0.1:9465");
  EXPECT_EQ(common::AdvertisedAddress("0.0.0.0:0", 4242, "w1.example"), "w1.example:4242");
}


// A client that connects and says nothing, or dribbles an endless head, holds the server for at
// most its deadline; a scrape behind it is then answered.
TEST(MetricsServer, SilentAndEndlessClientsDoNotHoldTheServer) {
  auto server = common::MetricsServer::Start("127.0.0.1:0", std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string addr = absl::StrCat("127.0.0.1:", (*server)->port());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int endless = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(endless, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string junk(20000, 'x');  // no end of head: answered 431 or dropped at the deadline
  (void)!write(endless, junk.data(), junk.size());
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> m = cluster::Cluster::HttpGet(addr, "/metrics", absl::Seconds(10));
  EXPECT_TRUE(m.ok()) << m.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(6));  // two deadlines of 2 s, not 20000 bytes' worth of waiting
  close(silent);
  close(endless);
}

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempStatePath("longhaul-coord-metrics");
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(10);
    o.clock = &clock_;
    auto svc = CoordinatorService::Create(std::move(*store), o);
    ASSERT_TRUE(svc.ok()) << svc.status();
    svc_ = std::move(*svc);
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<CoordinatorMetrics>(*registry_, svc_.get());
  }
  void TearDown() override {
    metrics_.reset();
    svc_.reset();
    RemoveStateFiles(path_);
  }
  void Register(const std::string& name, const std::string& metrics_address) {
    v1::RegisterRequest req;
    req.mutable_info()->set_name(name);
    req.mutable_info()->set_address("127.0.0.1:9");
    req.mutable_info()->set_region("eu");
    req.mutable_info()->set_metrics_address(metrics_address);
    v1::RegisterResponse resp;
    ASSERT_TRUE(svc_->Register(nullptr, &req, &resp).ok());
  }
  uint64_t Submit(const std::string& name) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(absl::StrCat("name: ", name, "\nstages: 2\nmodel: {layers: 2}\nsteps: 5\n"));
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
    return resp.job_id();
  }
  void Cancel(uint64_t job) {
    v1::CancelJobRequest req;
    req.set_job_id(job);
    v1::CancelJobResponse resp;
    EXPECT_TRUE(svc_->CancelJob(nullptr, &req, &resp).ok());
  }
  // Value of the series of `name` whose labels include all of `labels`; nullopt when absent.
  std::optional<double> Value(const std::string& name, const std::map<std::string, std::string>& labels) {
    for (const prometheus::MetricFamily& f : registry_->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        int matched = 0;
        for (const prometheus::ClientMetric::Label& l : m.label) matched += labels.count(l.name) && labels.at(l.name) == l.value;
        if (matched != static_cast<int>(labels.size())) continue;
        if (f.type == MetricType::Counter) return m.counter.value;
        return m.gauge.value;
      }
    }
    return std::nullopt;
  }

  common::FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  std::string path_;
  std::unique_ptr<CoordinatorService> svc_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
};

TEST_F(CoordinatorMetricsTest, NamesFollowTheRule) {
  Register("w0", "127.0.0.1:9999");
  Submit("a");
  metrics_->Refresh();
  const std::vector<prometheus::MetricFamily> families = registry_->Collect();
  EXPECT_GE(families.size(), 9u);
  for (const prometheus::MetricFamily& f : families) {
    EXPECT_EQ(CheckMetricName(f.name, f.type), "");
    EXPECT_FALSE(f.help.empty()) << f.name;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) EXPECT_NE(l.name, "job") << f.name << ": job is reserved";
    }
  }
}

TEST_F(CoordinatorMetricsTest, JobAndWorkerSeries) {
  Register("w0", "127.0.0.1:9999");
  const uint64_t id = Submit("pending-one");  // 2 stages, one worker: waits
  clock_.Advance(absl::Seconds(2));
  metrics_->Refresh();
  const std::string job = absl::StrCat(id);
  EXPECT_EQ(Value("longhaul_job_state", {{"job_id", job}, {"state", "pending"}}), 1.0);
  EXPECT_EQ(Value("longhaul_job_state", {{"job_id", job}, {"state", "running"}}), 0.0);
  EXPECT_EQ(Value("longhaul_job_step", {{"job_id", job}}), 0.0);
  EXPECT_EQ(Value("longhaul_job_restarts_total", {{"job_id", job}}), 0.0);
  EXPECT_EQ(Value("longhaul_job_info", {{"job_id", job}, {"name", "pending-one"}}), 1.0);
  EXPECT_EQ(Value("longhaul_worker_heartbeat_age_seconds", {{"worker", "w0"}}), 2.0);
  EXPECT_EQ(Value("longhaul_worker_state", {{"worker", "w0"}, {"state", "idle"}}), 1.0);
  EXPECT_EQ(Value("longhaul_workers", {{"state", "idle"}}), 1.0);
}

TEST_F(CoordinatorMetricsTest, PendingJobsAndTheMostRecentOthersHaveSeries) {
  // A pending (or running) job keeps its series however many jobs come after it.
  const uint64_t waiting = Submit("waiting");
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < CoordinatorMetrics::kMaxJobs + 3; ++i) {
    ids.push_back(Submit(absl::StrCat("j", i)));
    Cancel(ids.back());
  }
  metrics_->Refresh();
  EXPECT_TRUE(Value("longhaul_job_step", {{"job_id", absl::StrCat(waiting)}}).has_value());
  EXPECT_FALSE(Value("longhaul_job_step", {{"job_id", absl::StrCat(ids[0])}}).has_value());
  EXPECT_FALSE(Value("longhaul_job_info", {{"job_id", absl::StrCat(ids[2])}}).has_value());
  EXPECT_TRUE(Value("longhaul_job_step", {{"job_id", absl::StrCat(ids[3])}}).has_value());
  EXPECT_TRUE(Value("longhaul_job_step", {{"job_id", absl::StrCat(ids.back())}}).has_value());
  Cancel(Submit("one-more"));
  metrics_->Refresh();  // pushes ids[3] out
  EXPECT_FALSE(Value("longhaul_job_step", {{"job_id", absl::StrCat(ids[3])}}).has_value());
  EXPECT_FALSE(Value("longhaul_job_state", {{"job_id", absl::StrCat(ids[3])}}).has_value());
  size_t steps = 0;
  for (const auto& f : registry_->Collect()) {
    if (f.name == "longhaul_job_step") steps = f.metric.size();
  }
  EXPECT_EQ(steps, CoordinatorMetrics::kMaxJobs + 1);  // and the pending one
}

TEST_F(CoordinatorMetricsTest, DiscoveryListsLiveWorkersWithMetrics) {
  Register("w0", "127.0.0.1:9101");
  Register("w1", "");  // metrics off: not a target
  Register("w2", "10.0.0.2:9465");
  const nlohmann::json sd = nlohmann::json::parse(metrics_->DiscoveryJson());
  ASSERT_TRUE(sd.is_array());
  ASSERT_EQ(sd.size(), 2u) << sd.dump();
  EXPECT_EQ(sd[0]["targets"], nlohmann::json::array({"127.0.0.1:9101"}));
  EXPECT_EQ(sd[0]["labels"]["worker"], "w0");
  EXPECT_EQ(sd[0]["labels"]["region"], "eu");
  EXPECT_EQ(sd[1]["targets"][0], "10.0.0.2:9465");
  metrics_->Refresh();
  EXPECT_TRUE(Value("longhaul_worker_heartbeat_age_seconds", {{"worker", "w0"}}).has_value());
  // A worker that stops sending heartbeats is dead: no longer a target, its series gone, counted.
  clock_.Advance(absl::Seconds(11));
  svc_->CheckHeartbeats();
  EXPECT_EQ(nlohmann::json::parse(metrics_->DiscoveryJson()).size(), 0u);
  metrics_->Refresh();
  EXPECT_FALSE(Value("longhaul_worker_heartbeat_age_seconds", {{"worker", "w0"}}).has_value());
  EXPECT_FALSE(Value("longhaul_worker_state", {{"worker", "w0"}}).has_value());
  EXPECT_EQ(Value("longhaul_workers", {{"state", "dead"}}), 3.0);
}

}  // namespace
}  // namespace longhaul::coordinator
