// The Grafana dashboards (dashboards/grafana/*.json) against a real Prometheus (issue 18):
//  - DashboardFiles: every dashboard's panels have unique ids, a unit, and take their data source
//    through the `datasource` variable; the provisioning files name a Prometheus data source and a
//    file provider. No processes.
//  - DashboardsTest: two jobs run on a local cluster (one with links shaped to 0.4 Mbit/s and int8,
//    one unshaped with int2), Debian's `prometheus` scrapes them with a copy of
//    dashboards/prometheus.yml (only the coordinator's address and the intervals changed), and
//    EVERY PromQL expression of every panel of every dashboard is evaluated through Prometheus's
//    HTTP API: any error, or any query without series, fails naming dashboard, panel and query.
//    Panels marked kGpuOnly (GPU memory) have series only where a worker computes on a GPU: without
//    one their queries must still evaluate without error, and are reported as skipped, not faked.
//    The values the dashboards show are checked too: the shaped link is slower, the int2 link has
//    the higher quantisation error. Skipped (saying so) where prometheus is not installed.
// The jobs are long (they never finish during the test): the rate() panels need counters that
// move while Prometheus scrapes, and the cluster is torn down at the end.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

using nlohmann::json;

const std::string kDashboards = absl::StrCat(LONGHAUL_SOURCE_DIR, "/dashboards");
// The copy of dashboards/prometheus.yml scrapes every second; Grafana's $__rate_interval is then
// 4 x that (its rule: max(4 x scrape interval, $__interval + scrape interval)).
constexpr int kScrapeSeconds = 1;
constexpr int kRateIntervalSeconds = 4 * kScrapeSeconds;
constexpr double kShapedMbit = 0.4;
// In a panel's description: its series exist only where a worker computes on a GPU.
constexpr char kGpuOnly[] = "[GPU workers only]";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Dashboard {
  std::string file;  // file name
  json doc;
};

std::vector<Dashboard> LoadDashboards() {
  std::vector<Dashboard> out;
  for (const auto& e : std::filesystem::directory_iterator(kDashboards + "/grafana")) {
    if (e.path().extension() != ".json") continue;
    out.push_back({e.path().filename().string(), json::parse(ReadAll(e.path().string()))});
  }
  std::sort(out.begin(), out.end(),
            [](const Dashboard& a, const Dashboard& b) { return a.file < b.file; });
  return out;
}

// Every panel of a dashboard, those inside collapsed rows included.
std::vector<const json*> Panels(const json& d) {
  std::vector<const json*> out;
  if (!d.contains("panels")) return out;
  for (const json& p : d.at("panels")) {
    out.push_back(&p);
    if (!p.contains("panels")) continue;
    for (const json& q : p.at("panels")) out.push_back(&q);
  }
  return out;
}

bool UsesDatasourceVariable(const json& ds) {
  if (!ds.is_object()) return false;
  const std::string uid = ds.value("uid", "");
  return (uid == "${datasource}" || uid == "$datasource") && ds.value("type", "") == "prometheus";
}

TEST(DashboardFiles, PanelsHaveUniqueIdsUnitsAndTheDatasourceVariable) {
  const std::vector<Dashboard> dashboards = LoadDashboards();
  ASSERT_GE(dashboards.size(), 4u)
      << "overview, links, stages, workers in " << kDashboards << "/grafana";
  std::set<std::string> uids;
  for (const Dashboard& d : dashboards) {
    SCOPED_TRACE(d.file);
    EXPECT_FALSE(d.doc.value("title", "").empty());
    const std::string uid = d.doc.value("uid", "");
    EXPECT_FALSE(uid.empty());
    EXPECT_TRUE(uids.insert(uid).second) << "uid " << uid << " used twice";
    bool datasource_variable = false;
    for (const json& v : d.doc["templating"]["list"]) {
      if (v.value("type", "") == "datasource") {
        datasource_variable |=
            v.value("name", "") == "datasource" && v.value("query", "") == "prometheus";
      } else if (v.value("type", "") == "query") {
        EXPECT_TRUE(UsesDatasourceVariable(v["datasource"])) << "variable " << v.value("name", "");
      }
    }
    EXPECT_TRUE(datasource_variable)
        << "no variable `datasource` of type datasource (query prometheus)";
    std::set<int> ids;
    int panels = 0;
    for (const json* p : Panels(d.doc)) {
      const std::string title = p->value("title", "");
      ASSERT_TRUE(p->contains("id")) << "panel " << title << " has no id";
      EXPECT_TRUE(ids.insert(p->at("id").get<int>()).second)
          << "panel id " << p->at("id") << " used twice";
      if (p->value("type", "") == "row") continue;
      ++panels;
      SCOPED_TRACE(title);
      EXPECT_FALSE(title.empty());
      EXPECT_TRUE(UsesDatasourceVariable(p->value("datasource", json())))
          << p->value("datasource", json());
      const std::string unit = (*p)["fieldConfig"]["defaults"].value("unit", "");
      EXPECT_FALSE(unit.empty()) << "no unit (fieldConfig.defaults.unit)";
      const json& g = (*p)["gridPos"];
      EXPECT_LE(g.value("x", 0) + g.value("w", 0), 24);
      EXPECT_GT(g.value("h", 0), 0);
      ASSERT_FALSE(p->value("targets", json::array()).empty()) << "a panel without queries";
      std::set<std::string> refs;
      for (const json& t : (*p)["targets"]) {
        EXPECT_FALSE(t.value("expr", "").empty());
        // The marker excuses missing series only for the GPU's own metrics.
        EXPECT_EQ(absl::StrContains(p->value("description", ""), kGpuOnly),
                  absl::StrContains(t.value("expr", ""), "longhaul_gpu_"))
            << kGpuOnly << " marks the panels of longhaul_gpu_* queries, and only those";
        EXPECT_TRUE(refs.insert(t.value("refId", "")).second)
            << "refId " << t.value("refId", "") << " twice";
        if (t.contains("datasource")) {
          EXPECT_TRUE(UsesDatasourceVariable(t["datasource"])) << t["datasource"];
        }
      }
    }
    EXPECT_GT(panels, 0);
  }

  // Provisioning: a Prometheus data source, and a file provider.
  const YAML::Node ds = YAML::LoadFile(kDashboards + "/provisioning/datasources/prometheus.yml");
  EXPECT_EQ(ds["apiVersion"].as<int>(), 1);
  ASSERT_EQ(ds["datasources"].size(), 1u);
  EXPECT_EQ(ds["datasources"][0]["type"].as<std::string>(), "prometheus");
  EXPECT_FALSE(ds["datasources"][0]["url"].as<std::string>().empty());
  const YAML::Node prov = YAML::LoadFile(kDashboards + "/provisioning/dashboards/longhaul.yml");
  EXPECT_EQ(prov["apiVersion"].as<int>(), 1);
  ASSERT_EQ(prov["providers"].size(), 1u);
  EXPECT_EQ(prov["providers"][0]["type"].as<std::string>(), "file");
  EXPECT_FALSE(prov["providers"][0]["options"]["path"].as<std::string>().empty());
}

// --- A real Prometheus -----------------------------------------------------------------------

// GET http://host_port/path (HTTP/1.0): the status code and body, whatever the status (Prometheus
// explains a bad query in a 400's body).
absl::StatusOr<std::pair<int, std::string>> Get(const std::string& host_port,
                                                const std::string& path) {
  const size_t colon = host_port.rfind(':');
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host_port.substr(0, colon).c_str(), host_port.substr(colon + 1).c_str(), &hints,
                  &res) != 0) {
    return absl::InvalidArgumentError(host_port);
  }
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const bool connected = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  if (!connected ||
      send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot reach ", host_port));
  }
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = resp.find("\r\n\r\n");
  int code = 0;
  if (end == std::string::npos || resp.size() < 12 || !absl::SimpleAtoi(resp.substr(9, 3), &code)) {
    return absl::DataLossError(absl::StrCat(host_port, path, ": no HTTP answer"));
  }
  return std::make_pair(code, resp.substr(end + 4));
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// A port nobody listens on now (Prometheus cannot pick its own and say which).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// The result of an instant query: series (labels, value), or why it failed.
struct QueryResult {
  std::string error;  // "" when Prometheus answered success
  std::vector<std::pair<std::map<std::string, std::string>, double>> series;
};

QueryResult Query(const std::string& prom, const std::string& expr) {
  QueryResult r;
  absl::StatusOr<std::pair<int, std::string>> a =
      Get(prom, "/api/v1/query?query=" + UrlEncode(expr));
  if (!a.ok()) {
    r.error = a.status().ToString();
    return r;
  }
  const json j = json::parse(a->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success") {
    r.error = absl::StrCat("HTTP ", a->first, ": ",
                           j.is_discarded() ? a->second : j.value("error", a->second));
    return r;
  }
  const json& data = j["data"];
  if (data.value("resultType", "") != "vector") {
    r.error =
        absl::StrCat("result type ", data.value("resultType", ""), ", not a vector of series");
    return r;
  }
  for (const json& s : data["result"]) {
    std::map<std::string, std::string> labels =
        s["metric"].get<std::map<std::string, std::string>>();
    double v = 0;
    (void)absl::SimpleAtod(s["value"][1].get<std::string>(), &v);  // "NaN" parses too
    r.series.emplace_back(std::move(labels), v);
  }
  return r;
}

// $env when set, else `name` found on PATH; "" when neither.
std::string FindTool(const char* env, const std::string& name) {
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0') return e;
  auto [rc, out] = Cluster::Run(absl::StrCat("command -v ", name));
  return rc == 0 ? std::string(absl::StripTrailingAsciiWhitespace(out)) : "";
}

// dashboards/prometheus.yml pointed at `coordinator` (its metrics address) and scraping every
// kScrapeSeconds: the targets and intervals are replaced, everything else is the shipped file.
// Fails when the file no longer has the shape this expects (one static coordinator target, one
// http_sd for the workers, both at the coordinator's default metrics port).
absl::StatusOr<std::string> DeriveConfig(const std::string& coordinator) {
  YAML::Node c = YAML::LoadFile(kDashboards + "/prometheus.yml");
  const std::string interval = absl::StrCat(kScrapeSeconds, "s");
  c["global"]["scrape_interval"] = interval;
  c["global"]["scrape_timeout"] = interval;
  c["global"]["evaluation_interval"] = interval;
  int statics = 0, sds = 0;
  for (YAML::Node job : c["scrape_configs"]) {
    for (YAML::Node sc : job["static_configs"]) {
      for (YAML::Node t : sc["targets"]) {
        if (t.as<std::string>() != "localhost:9464") {
          return absl::FailedPreconditionError(
              absl::StrCat("unexpected static target ", t.as<std::string>()));
        }
        t = coordinator;
        ++statics;
      }
    }
    for (YAML::Node sd : job["http_sd_configs"]) {
      if (sd["url"].as<std::string>() != "http://localhost:9464/sd") {
        return absl::FailedPreconditionError(
            absl::StrCat("unexpected http_sd url ", sd["url"].as<std::string>()));
      }
      sd["url"] = absl::StrCat("http://", coordinator, "/sd");
      // Prometheus also uses the refresh interval as the request timeout: one second is tight on a
      // loaded machine.
      sd["refresh_interval"] = absl::StrCat(2 * kScrapeSeconds, "s");
      ++sds;
    }
  }
  if (statics != 1 || sds != 1) {
    return absl::FailedPreconditionError(absl::StrCat(statics, " static coordinator targets and ",
                                                      sds, " http_sd configs; expected 1 and 1"));
  }
  YAML::Emitter out;
  out << c;
  return std::string(out.c_str()) + "\n";
}

std::string JobSpec(const std::string& name, const std::string& codec, double rate_mbit) {
  return absl::StrCat("name: ", name, R"(
model: {layers: 2, hidden: 64, heads: 4, context: 32}
stages: 2
micro_batches: 4
micro_batch_size: 4
codecs: {forward: ")",
                      codec, R"(", backward: ")", codec, R"("}
steps: 1000000
seed: 5
links: {rate_mbit: )",
                      rate_mbit, "}\n");
}

class DashboardsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (prometheus_ != nullptr) {
      prometheus_->Signal(SIGTERM);
      prometheus_->Wait(absl::Seconds(10));
    }
    if (HasFailure()) {
      c_.DumpLogs();
      std::printf("--- prometheus.log\n%s\n", ReadAll(c_.dir() + "/prometheus.log").c_str());
    }
  }

  // Polls `expr` until `ok` accepts its result or `timeout` passes; the last result.
  QueryResult WaitFor(const std::string& expr, const std::function<bool(const QueryResult&)>& ok,
                      absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    QueryResult r;
    for (;;) {
      r = Query(prom_, expr);
      if (ok(r) || absl::Now() > end) return r;
      absl::SleepFor(absl::Milliseconds(250));
    }
  }

  Cluster c_;
  std::unique_ptr<Process> prometheus_;
  std::string prom_;  // 127.0.0.1:port
};

TEST_F(DashboardsTest, EveryPanelQueryReturnsSeries) {
  const std::string prometheus = FindTool("LONGHAUL_PROMETHEUS", "prometheus");
  if (prometheus.empty()) {
    GTEST_SKIP()
        << "prometheus is not installed (Debian's prometheus package; tools/setup.sh installs it)";
  }
  const std::string promtool = FindTool("LONGHAUL_PROMTOOL", "promtool");

  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_FALSE(c_.metrics_address().empty());
  ASSERT_TRUE(c_.StartWorkers(4).ok());
  // Links shaped far below what the stages produce, and a much coarser codec on unshaped links.
  absl::StatusOr<uint64_t> shaped = c_.Submit(JobSpec("shaped", "int8", kShapedMbit));
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  absl::StatusOr<uint64_t> coarse = c_.Submit(JobSpec("coarse", "int2", 0));
  ASSERT_TRUE(coarse.ok()) << coarse.status();
  for (uint64_t job : {*shaped, *coarse}) {
    absl::StatusOr<v1::JobStatus> st = c_.WaitForStep(job, 1, absl::Minutes(1));
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->state(), v1::JOB_STATE_RUNNING) << st->error();
  }

  // The shipped configuration, and the copy pointed at this cluster, both pass promtool.
  absl::StatusOr<std::string> config = DeriveConfig(c_.metrics_address());
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string config_file = c_.dir() + "/prometheus.yml";
  std::ofstream(config_file) << *config;
  if (!promtool.empty()) {
    for (const std::string& f : {kDashboards + "/prometheus.yml", config_file}) {
      auto [rc, out] = Cluster::Run(absl::StrCat(promtool, " check config ", f));
      EXPECT_EQ(rc, 0) << "promtool check config " << f << ":\n" << out;
    }
  }

  // Prometheus on a free port (another process may take it between our check and its bind: retry).
  for (int attempt = 0; attempt < 3 && prometheus_ == nullptr; ++attempt) {
    prom_ = absl::StrCat("127.0.0.1:", FreePort());
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
        {prometheus, "--config.file=" + config_file,
         "--storage.tsdb.path=" + c_.dir() + "/prometheus-data", "--web.listen-address=" + prom_},
        c_.dir() + "/prometheus.log");
    ASSERT_TRUE(p.ok()) << p.status();
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while ((*p)->running() && absl::Now() < end) {
      absl::StatusOr<std::pair<int, std::string>> r = Get(prom_, "/-/ready");
      if (r.ok() && r->first == 200) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    if ((*p)->running()) prometheus_ = std::move(*p);
  }
  ASSERT_NE(prometheus_, nullptr) << "prometheus did not start:\n"
                                  << ReadAll(c_.dir() + "/prometheus.log");

  // Every daemon found (the workers through the coordinator's discovery) and scraped, and enough
  // scrapes of moving counters that every rate() window holds some.
  auto count_is = [](int n) {
    return [n](const QueryResult& r) {
      return r.error.empty() && r.series.size() == 1 &&
             r.series[0].second == static_cast<double>(n);
    };
  };
  QueryResult up =
      WaitFor(R"(count(up{job="longhaul-workers"} == 1))", count_is(4), absl::Seconds(30));
  ASSERT_TRUE(count_is(4)(up)) << "not every worker is scraped through /sd: " << up.error;
  up = WaitFor(R"(count(up{job="longhaul-coordinator"} == 1))", count_is(1), absl::Seconds(10));
  ASSERT_TRUE(count_is(1)(up)) << "the coordinator is not scraped: " << up.error;
  const std::string moving =
      absl::StrCat("count(rate(longhaul_stage_steps_total[", kRateIntervalSeconds, "s]) > 0)");
  QueryResult m = WaitFor(moving, count_is(4), absl::Seconds(30));
  ASSERT_TRUE(count_is(4)(m)) << "the four stages' step counters do not move in Prometheus: "
                              << m.error;

  // Grafana's variables: the job variable's own query (label_values) must list both jobs; "All"
  // selected, Grafana sends the values as a regex alternation.
  const std::string job_values = absl::StrCat("(", *shaped, "|", *coarse, ")");
  std::map<std::string, std::string> variables = {
      {"__rate_interval", absl::StrCat(kRateIntervalSeconds, "s")},
      {"__interval", absl::StrCat(kScrapeSeconds, "s")},
      {"__range", "5m"},
  };
  std::vector<std::string> failures;
  std::vector<Dashboard> dashboards = LoadDashboards();
  for (const Dashboard& d : dashboards) {
    for (const json& v : d.doc["templating"]["list"]) {
      if (v.value("type", "") != "query") continue;
      const std::string name = v.value("name", "");
      // A string, or (newer Grafana) an object whose `query` is the string.
      const std::string q =
          v["query"].is_string() ? v["query"].get<std::string>() : v["query"].value("query", "");
      // label_values(METRIC, LABEL): what Grafana asks /api/v1/series for; the same as this query.
      const size_t open = q.find('('), comma = q.rfind(','), close = q.rfind(')');
      if (!absl::StartsWith(q, "label_values(") || comma == std::string::npos) {
        failures.push_back(
            absl::StrCat(d.file, ": variable ", name, ": not label_values(METRIC, LABEL): ", q));
        continue;
      }
      const std::string metric(absl::StripAsciiWhitespace(q.substr(open + 1, comma - open - 1)));
      const std::string label(absl::StripAsciiWhitespace(q.substr(comma + 1, close - comma - 1)));
      const QueryResult r = Query(prom_, absl::StrCat("count by (", label, ") (", metric, ")"));
      std::set<std::string> values;
      for (const auto& [labels, value] : r.series) {
        values.insert(labels.count(label) ? labels.at(label) : "");
      }
      if (!r.error.empty() || values.empty()) {
        failures.push_back(absl::StrCat(d.file, ": variable ", name, ": ", q, ": ",
                                        r.error.empty() ? "no values" : r.error));
      }
      if (name == "job_id") {
        EXPECT_TRUE(values.count(absl::StrCat(*shaped)) && values.count(absl::StrCat(*coarse)))
            << d.file << ": " << q;
        variables[name] = job_values;
      } else {
        variables[name] = absl::StrCat("(", absl::StrJoin(values, "|"), ")");
      }
    }
  }

  // Every query of every panel: errors fail at once; no series is retried until a deadline (a
  // series may need one more scrape), then fails.
  struct Pending {
    std::string where, expr;
    bool gpu_only = false;
  };
  std::vector<Pending> pending;
  std::map<std::string, QueryResult> results;  // "dashboard title / panel title / refId" -> result
  for (const Dashboard& d : dashboards) {
    for (const json* p : Panels(d.doc)) {
      for (const json& t : p->value("targets", json::array())) {
        std::string expr = t.value("expr", "");
        // Longest names first, so $job_id is not taken for $job; both $x and ${x} forms.
        std::vector<std::string> names;
        for (const auto& [name, value] : variables) names.push_back(name);
        std::sort(names.begin(), names.end(),
                  [](const auto& a, const auto& b) { return a.size() > b.size(); });
        for (const std::string& name : names) {
          expr = absl::StrReplaceAll(
              expr, {{"${" + name + "}", variables[name]}, {"$" + name, variables[name]}});
        }
        const std::string where = absl::StrCat(d.doc.value("title", d.file), " / ",
                                               p->value("title", ""), " / ", t.value("refId", ""));
        if (absl::StrContains(expr, "$")) {
          failures.push_back(
              absl::StrCat(where, ": a variable the test does not know: ", t.value("expr", "")));
          continue;
        }
        pending.push_back({where, expr, absl::StrContains(p->value("description", ""), kGpuOnly)});
      }
    }
  }
  ASSERT_GE(pending.size(), 20u) << "fewer queries than expected: are the dashboards there?";
  const size_t queries = pending.size();
  // Workers on a GPU, as discovery labels them (the local cluster's compute on the CPU).
  const QueryResult gpus = Query(prom_, R"(count(up{job="longhaul-workers", device=~"cuda.*"}))");
  ASSERT_TRUE(gpus.error.empty()) << gpus.error;
  const bool gpu_workers = !gpus.series.empty();
  std::vector<std::string> skipped;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (!pending.empty()) {
    std::vector<Pending> again;
    for (const Pending& q : pending) {
      QueryResult r = Query(prom_, q.expr);
      if (!r.error.empty()) {
        failures.push_back(absl::StrCat(q.where, ": ", q.expr, "\n    error: ", r.error));
      } else if (r.series.empty() && q.gpu_only && !gpu_workers) {
        skipped.push_back(q.where);  // it parsed and ran; nothing can have series here
      } else if (r.series.empty()) {
        again.push_back(q);
      } else {
        results[q.where] = std::move(r);
      }
    }
    pending = std::move(again);
    if (pending.empty() || absl::Now() > deadline) break;
    absl::SleepFor(absl::Seconds(1));
  }
  for (const Pending& q : pending)
    failures.push_back(absl::StrCat(q.where, ": ", q.expr, "\n    no series"));
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << queries
                                << " dashboard queries failed:\n  "
                                << absl::StrJoin(failures, "\n  ");
  std::printf("%zu dashboard queries evaluated against prometheus, %zu failed\n", queries,
              failures.size());
  for (const std::string& where : skipped) {
    std::printf("skipped: %s (evaluates without error; no series: no worker here computes on a GPU)\n",
                where.c_str());
  }

  // What the dashboards show: per job, its forward link (stage 0 -> 1).
  auto forward = [&](const std::string& where, uint64_t job) {
    auto it = results.find(where);
    if (it == results.end()) {
      ADD_FAILURE() << "no result for " << where;
      return -1.0;
    }
    for (const auto& [labels, value] : it->second.series) {
      if (labels.count("job_id") && labels.at("job_id") == absl::StrCat(job) &&
          labels.count("stage") && labels.at("stage") == "0" && labels.count("direction") &&
          labels.at("direction") == "forward") {
        return value;
      }
    }
    ADD_FAILURE() << where << ": no series of job " << job << "'s forward link";
    return -1.0;
  };
  const double shaped_bps = forward("longhaul / Links / Throughput vs limit / A", *shaped);
  const double coarse_bps = forward("longhaul / Links / Throughput vs limit / A", *coarse);
  const double limit = forward("longhaul / Links / Throughput vs limit / B", *shaped);
  EXPECT_EQ(limit, kShapedMbit * 1e6 / 8);
  EXPECT_GT(shaped_bps, 0);
  EXPECT_LT(shaped_bps, coarse_bps)
      << "the link shaped to " << kShapedMbit << " Mbit/s is not the slower one";
  EXPECT_LT(shaped_bps, 1.25 * limit) << "above its limit";
  const double int8_error = forward("longhaul / Links / Live quantisation error / A", *shaped);
  const double int2_error = forward("longhaul / Links / Live quantisation error / A", *coarse);
  EXPECT_GT(int8_error, 0);
  EXPECT_GT(int2_error, int8_error) << "int2 does not show a higher quantisation error than int8";
  std::printf(
      "forward links: shaped (int8, %.1f Mbit/s) %.0f B/s, error %.4f; unshaped (int2) %.0f B/s, "
      "error %.4f\n",
      kShapedMbit, shaped_bps, int8_error, coarse_bps, int2_error);
}

}  // namespace
}  // namespace longhaul::cluster
