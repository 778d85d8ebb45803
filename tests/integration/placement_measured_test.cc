// Placement measured end to end (ctest label: integration; root only, skipped otherwise): a real
// coordinator and four workers, each in its own network namespace (longhaul-netem with regions,
// netem/tc/network.h), two regions -- 200 Mbit/s inside a region, 2 Mbit/s (100x slower) between
// -- and the workers' ids alternating between the regions, so that the naive order (w0, w1, w2,
// w3) crosses the slow link on every hop. The workers probe each other; the coordinator places a
// job with the measurements. The same job then runs in the naive order (a fifth worker that does
// not probe registers, so a link among the idle workers is unmeasured and the coordinator falls
// back to the naive order over the lowest ids, w0..w3). Measured steady-state step times: the
// placed job's at least 2x shorter than the naive one's, and within 25% of the model's prediction
// (docs/placement.md, "Measured: a placed job on two regions", has the numbers).
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "netem/tc/claim.h"
#include "netem/tc/network.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

constexpr double kInsideMbit = 200, kBetweenMbit = 2;

// Hosts: the coordinator (no region, unshaped), w0..w3 alternating between regions a and b, and
// the spare w4.
std::string TopologyYaml() {
  std::string y = absl::StrCat("name: lhpm\nsubnet: 10.83.0\nbetween_regions: {rate_mbit: ", kBetweenMbit,
                               "}\nhosts:\n  - {name: coord}\n");
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&y, "  - {name: w", i, ", region: ", i % 2 == 0 ? "a" : "b", ", rate_mbit: ", kInsideMbit, "}\n");
  }
  return y;
}

// 4 stages of one block each. Raw fp32 on both links, so that a micro-batch's 4 x 64 tokens x 128
// hidden x 4 bytes (131 kB) take about 0.55 s across the regions and 5 ms inside one, while a
// stage computes for a few ms: the links, not the 2 cores, set the step time. A 4-stage pipeline
// on 2 + 2 workers must cross the slow link once whatever the order, in the middle. With one
// micro-batch per step only the fill and drain differ: the placed order crosses once, the naive
// order three times (2.9x measured). With 4 micro-batches of 1F1B the slow link k carries
// min(S - k - 1, M) = 2 activations alone before its two directions overlap, about 6 transfer
// times per step against the naive order's 10: the model predicts 1.7x, so the 2x is asserted on
// the one-micro-batch pair and the 4-micro-batch placed job checks the schedule-aware model
// (docs/placement.md). No checkpoint copies (they would cross the slow link between steps).
std::string JobYaml(const std::string& name, int micro_batches) {
  return absl::StrCat("name: ", name, "\nmicro_batches: ", micro_batches, R"(
model: {layers: 4, hidden: 128, heads: 4, context: 64}
stages: 4
micro_batch_size: 4
codecs: {forward: fp32, backward: fp32}
steps: 6
seed: 5
checkpoint: {interval: 0, replicate: none}
)");
}

struct JobRun {
  v1::JobStatus status;
  double step_seconds = 0;  // steady state: from the first step's end to the last's, per step
  std::vector<std::string> workers;  // by stage
};

class PlacementMeasuredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces and tc (CI runs as root)";
    absl::StatusOr<netem::Topology> t = netem::ParseTopology(TopologyYaml());
    ASSERT_TRUE(t.ok()) << t.status();
    topo_ = *t;
    // Another run of this test has namespaces of this name: wait for it rather than remove them.
    absl::StatusOr<netem::NetworkClaim> claim = netem::NetworkClaim::Acquire(topo_.name, absl::Minutes(2));
    ASSERT_TRUE(claim.ok()) << claim.status();
    claim_.emplace(*std::move(claim));
    net_ = std::make_unique<netem::Network>(topo_, netem::RunCommand);
    (void)net_->Down();  // leftovers of an aborted run
    ASSERT_TRUE(net_->Up().ok());
    auto host = [](const std::string& role) { return role == "coordinator" ? std::string("coord") : role; };
    c_ = std::make_unique<Cluster>(1);
    c_->SetPlacement({[this, host](const std::string& r) { return topo_.Namespace(host(r)); },
                      [this, host](const std::string& r) { return topo_.Address(host(r)); }});
  }
  void TearDown() override {
    if (c_ && HasFailure()) c_->DumpLogs();
    spare_.reset();
    c_.reset();  // every process gone before their namespaces
    if (net_) {
      EXPECT_TRUE(net_->Down().ok());
    }
  }

  // Runs the job to its end, noting when the last stage completed each step.
  JobRun RunJob(const std::string& name, int micro_batches) {
    JobRun out;
    absl::StatusOr<uint64_t> job = c_->Submit(JobYaml(name, micro_batches));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return out;
    std::map<int64_t, absl::Time> done;
    const absl::Time end = absl::Now() + absl::Minutes(2);
    for (;;) {
      absl::StatusOr<v1::JobStatus> st = c_->Get(*job);
      const absl::Time now = absl::Now();
      if (st.ok()) {
        if (st->step() > 0 && !done.count(st->step())) done[st->step()] = now;
        out.status = *st;
        const v1::JobState s = st->state();
        if (s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED) break;
      }
      if (now > end) {
        ADD_FAILURE() << name << " did not end in 2 minutes";
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(out.status.state(), v1::JOB_STATE_SUCCEEDED) << out.status.error();
    // Steps seen one by one (a poll every 10 ms, steps of a second or more): from step 1 to the last.
    if (done.size() >= 3 && done.count(1)) {
      const auto& [last, at] = *done.rbegin();
      out.step_seconds = absl::ToDoubleSeconds(at - done[1]) / static_cast<double>(last - 1);
    }
    for (int s = 0; s < 4; ++s) {
      absl::StatusOr<std::string> w = c_->WorkerOf(*job, s);
      out.workers.push_back(w.ok() ? *w : "?");
    }
    return out;
  }

  static int Crossings(const std::vector<std::string>& workers) {
    int n = 0;
    for (size_t s = 0; s + 1 < workers.size(); ++s) {
      // w<even> in region a, w<odd> in region b.
      n += (workers[s].back() - '0') % 2 != (workers[s + 1].back() - '0') % 2;
    }
    return n;
  }

  std::optional<netem::NetworkClaim> claim_;  // declared first: let go after the namespaces are gone
  netem::Topology topo_;
  std::unique_ptr<netem::Network> net_;
  std::unique_ptr<Cluster> c_;
  std::unique_ptr<Process> spare_;
};

TEST_F(PlacementMeasuredTest, PlacedJobIsTwiceAsFastAsTheNaiveOrderAndAsPredicted) {
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c_->StartCoordinator().ok());
  // One at a time, so that the ids (the naive order) follow the names.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c_->StartWorkers(1).ok());

  // Every directed pair measured (the first probes go out at registration).
  int measured = 0;
  for (const absl::Time end = absl::Now() + absl::Minutes(1); absl::Now() < end; absl::SleepFor(absl::Milliseconds(200))) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListLinksResponse links;
    if (!c_->stub().ListLinks(&ctx, {}, &links).ok()) continue;
    measured = 0;
    for (const auto& l : links.links()) measured += l.measured_unix() > 0;
    if (measured == 12) {
      for (const auto& l : links.links()) {
        std::printf("link %llu -> %llu: %.2f Mbit/s, RTT %.3f ms\n", static_cast<unsigned long long>(l.from_worker_id()),
                    static_cast<unsigned long long>(l.to_worker_id()), l.mbit_per_s(), l.rtt_ms());
      }
      break;
    }
  }
  ASSERT_EQ(measured, 12);

  const JobRun placed = RunJob("placed", 1);
  EXPECT_TRUE(absl::StartsWith(placed.status.placement(), "bandwidth-aware")) << placed.status.placement();
  EXPECT_EQ(Crossings(placed.workers), 1) << placed.workers[0] << placed.workers[1] << placed.workers[2] << placed.workers[3];
  const JobRun placed4 = RunJob("placed-4mb", 4);
  EXPECT_EQ(Crossings(placed4.workers), 1) << placed4.workers[0] << placed4.workers[1] << placed4.workers[2] << placed4.workers[3];

  // The spare: registered, idle, never probed (--probe-listen none), so the next job cannot be
  // modelled and goes to the lowest ids in order.
  spare_ = [&]() -> std::unique_ptr<Process> {
    std::vector<std::string> argv = {"/usr/sbin/ip", "netns", "exec", topo_.Namespace("w4"), Cluster::Bin("longhaul-worker"),
                                     absl::StrCat("--coordinator=", c_->address()),
                                     absl::StrCat("--listen=", topo_.Address("w4"), ":0"), "--name=w4", "--threads=1",
                                     absl::StrCat("--data-dir=", c_->dir(), "/w4"), "--probe-listen=none"};
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, absl::StrCat(c_->dir(), "/w4.log"));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }();
  ASSERT_NE(spare_, nullptr);
  ASSERT_TRUE(c_->WaitForIdleWorkers(5, absl::Seconds(30)).ok());

  const JobRun naive = RunJob("naive", 1);
  EXPECT_TRUE(absl::StartsWith(naive.status.placement(), "naive order")) << naive.status.placement();
  EXPECT_EQ(naive.workers, (std::vector<std::string>{"w0", "w1", "w2", "w3"}));
  EXPECT_EQ(Crossings(naive.workers), 3);

  const auto show = [](const char* what, const JobRun& run, double predicted) {
    std::string order = run.workers[0];
    for (size_t s = 1; s < run.workers.size(); ++s) absl::StrAppend(&order, "-", run.workers[s]);
    std::printf("%-22s %s: measured %.3f s per step, predicted %.3f s (%+.1f%%)\n", what, order.c_str(), run.step_seconds,
                predicted, 100 * (run.step_seconds / predicted - 1));
  };
  const double predicted = placed.status.predicted_step_seconds(), naive_predicted = placed.status.naive_step_seconds();
  const double predicted4 = placed4.status.predicted_step_seconds();
  show("placed, 1 micro-batch", placed, predicted);
  show("naive, 1 micro-batch", naive, naive_predicted);
  show("placed, 4 micro-batches", placed4, predicted4);
  std::printf("measured naive / placed: %.2fx (predicted %.2fx); the test took %.0f s\n",
              naive.step_seconds / placed.step_seconds, naive_predicted / predicted,
              absl::ToDoubleSeconds(absl::Now() - t0));
  RecordProperty("placed_step_seconds", std::to_string(placed.step_seconds));
  RecordProperty("placed_predicted_seconds", std::to_string(predicted));
  RecordProperty("naive_step_seconds", std::to_string(naive.step_seconds));
  RecordProperty("naive_predicted_seconds", std::to_string(naive_predicted));
  RecordProperty("placed_4mb_step_seconds", std::to_string(placed4.step_seconds));
  RecordProperty("placed_4mb_predicted_seconds", std::to_string(predicted4));
  ASSERT_GT(placed.step_seconds, 0);
  ASSERT_GT(placed4.step_seconds, 0);
  ASSERT_GT(predicted, 0);
  ASSERT_GT(predicted4, 0);
  EXPECT_GE(naive.step_seconds / placed.step_seconds, 2.0);
  EXPECT_LE(std::abs(placed.step_seconds / predicted - 1), 0.25);
  EXPECT_LE(std::abs(placed4.step_seconds / predicted4 - 1), 0.25);
}

}  // namespace
}  // namespace longhaul::cluster
