// Link measurement and placement end to end: a real coordinator and three workers on loopback
// (ctest label: integration). The workers probe each other when they register and report; the
// coordinator's matrix (`longhaulctl links`) ends up with every directed pair and every worker's
// compute speed; `longhaulctl plan` predicts without starting anything; a job started afterwards
// records how it was placed.
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

constexpr char kSpec[] = R"(name: placed
model: {layers: 3, hidden: 64, heads: 4, context: 32}
stages: 3
micro_batches: 2
micro_batch_size: 2
codecs: {forward: "int8", backward: "int8"}
steps: 2
seed: 3
)";

class LinksTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  std::pair<int, std::string> Ctl(const std::string& args) {
    return Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " ", args));
  }
  Cluster c_;
};

TEST_F(LinksTest, EveryPairIsMeasuredListedAndUsedForPlacement) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(3).ok());
  const std::vector<std::string> names = {"w0", "w1", "w2"};

  // The first probes go out at registration: every directed pair within a minute.
  nlohmann::json links;
  int measured = 0;
  for (const absl::Time end = absl::Now() + absl::Minutes(1); absl::Now() < end; absl::SleepFor(absl::Milliseconds(200))) {
    auto [rc, out] = Ctl("links --json");
    ASSERT_EQ(rc, 0) << out;
    links = nlohmann::json::parse(out);
    measured = 0;
    for (const auto& l : links["links"]) measured += l["measured"].get<bool>();
    if (measured == 6) break;
  }
  ASSERT_EQ(measured, 6) << links.dump(2);
  ASSERT_EQ(links["workers"].size(), 3u);
  for (const auto& w : links["workers"]) {
    EXPECT_GT(w["compute_gflops"].get<double>(), 0) << w.dump();
    EXPECT_NE(w["probe_address"].get<std::string>(), "") << w.dump();
  }
  for (const auto& l : links["links"]) {
    EXPECT_GT(l["mbit_per_s"].get<double>(), 1) << l.dump();
    EXPECT_GT(l["rtt_ms"].get<double>(), 0) << l.dump();
    EXPECT_GE(l["age_seconds"].get<double>(), 0) << l.dump();
  }

  // The table: one line per directed pair with Mbit/s, RTT and age.
  auto [rc, table] = Ctl("links");
  ASSERT_EQ(rc, 0) << table;
  for (const std::string& from : names) {
    for (const std::string& to : names) {
      if (from == to) continue;
      const std::regex line("(^|\n)" + from + " +" + to + " +[0-9.]+ +[0-9.]+ ms +[0-9]+s");
      EXPECT_TRUE(std::regex_search(table, line)) << from << " -> " << to << " missing in:\n" << table;
    }
  }
  EXPECT_NE(table.find("3 live worker(s): 6 of 6 directed links measured"), std::string::npos) << table;

  // plan: a placement, its prediction and the naive order's; nothing submitted.
  const std::string spec = absl::StrCat(c_.dir(), "/placed.yaml");
  std::ofstream(spec) << kSpec;
  auto [prc, plan] = Ctl(absl::StrCat("plan ", spec));
  ASSERT_EQ(prc, 0) << plan;
  EXPECT_NE(plan.find("placement: "), std::string::npos) << plan;
  EXPECT_NE(plan.find("predicted step time: "), std::string::npos) << plan;
  // (The naive order is by worker id, and the workers registered in whatever order they started.)
  EXPECT_NE(plan.find("naive order (w"), std::string::npos) << plan;
  EXPECT_NE(plan.find("nothing was started"), std::string::npos) << plan;
  for (int s = 0; s < 3; ++s) EXPECT_NE(plan.find(absl::StrCat("stage ", s, ": w")), std::string::npos) << plan;
  // Replica counts that differ: every slot with its compute, and a link line for each of stage 0's.
  const std::string counts = absl::StrCat(c_.dir(), "/counts.yaml");
  std::ofstream(counts) << "name: counts\nmodel: {layers: 2, hidden: 64, heads: 4, context: 32}\nstages: 2\n"
                           "replicas: [2, 1]\nmicro_batches: 2\nmicro_batch_size: 2\nsteps: 2\n";
  auto [crc, cplan] = Ctl(absl::StrCat("plan ", counts));
  ASSERT_EQ(crc, 0) << cplan;
  for (const char* want : {"stage 0 replica 0: w", "stage 0 replica 1: w", "stage 1 replica 0: w", "link to stage 1: ",
                           "predicted step time: "}) {
    EXPECT_NE(cplan.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << cplan;
  }
  const std::regex slot_line("stage 0 replica 1: w[0-9]+ \\(local\\), layers 0\\.\\.0, compute [0-9.e+-]+ ms per micro-batch\n");
  EXPECT_TRUE(std::regex_search(cplan, slot_line)) << cplan;
  size_t links_listed = 0;
  for (size_t at = cplan.find("link to stage 1: "); at != std::string::npos; at = cplan.find("link to stage 1: ", at + 1)) {
    ++links_listed;
  }
  EXPECT_EQ(links_listed, 2u) << cplan;
  auto [jrc, jobs] = Ctl("status --json");
  ASSERT_EQ(jrc, 0) << jobs;
  EXPECT_TRUE(nlohmann::json::parse(jobs).empty()) << jobs;

  // A job placed with the measurements: it runs, and says how it was placed.
  absl::StatusOr<uint64_t> job = c_.Submit(kSpec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(2));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_GT(st->predicted_step_seconds(), 0) << st->placement();
  EXPECT_GT(st->naive_step_seconds(), 0);
  auto [src, detail] = Ctl(absl::StrCat("status ", *job));
  ASSERT_EQ(src, 0) << detail;
  EXPECT_NE(detail.find("placement: "), std::string::npos) << detail;
  EXPECT_NE(detail.find("predicted step"), std::string::npos) << detail;
}

}  // namespace
}  // namespace longhaul::cluster
