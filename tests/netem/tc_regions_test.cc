// longhaul-netem's regions (netem/tc/network.h): per-pair rates on one bridge -- a host's traffic
// to hosts of other regions paced at `between_regions.rate_mbit`, the rest at its own rate. The
// topology's parsing and the tc commands always; a real network (root only, skipped otherwise)
// whose cross-region link delivers its rate while the link inside the region is much faster.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "netem/tc/network.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::netem {
namespace {

constexpr char kTopology[] = R"(name: rg
subnet: 10.82.0
between_regions: {rate_mbit: 4}
hosts:
  - {name: coord}
  - {name: a1, region: east, rate_mbit: 200}
  - {name: a2, region: east, rate_mbit: 200}
  - {name: b1, region: west}
)";

TEST(RegionsTest, ParsesRegionsAndTheRateBetweenThem) {
  absl::StatusOr<Topology> t = ParseTopology(kTopology);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->between_regions_mbit, 4);
  EXPECT_EQ(t->between_regions_queue_ms, 400);
  EXPECT_EQ(t->hosts[0].region, "");
  EXPECT_EQ(t->hosts[1].region, "east");
  EXPECT_EQ(t->hosts[3].region, "west");
  // Without between_regions a region is only a label.
  EXPECT_TRUE(ParseTopology("hosts:\n  - {name: a, region: x, delay_ms: 5}\n").ok());
}

TEST(RegionsTest, ListsEveryProblem) {
  auto t = ParseTopology("between_regions: {rate_mbit: 0, queue_ms: 0, burst: 3}\n"
                         "hosts:\n  - {name: a, region: \"x y\"}\n  - {name: b, region: z, delay_ms: 10}\n");
  ASSERT_FALSE(t.ok());
  const std::string m(t.status().message());
  for (const char* want : {"between_regions.rate_mbit", "between_regions.queue_ms", "between_regions.burst: unknown key",
                           "hosts[0].region", "hosts[1]: delay_ms, jitter_ms and loss are not supported"}) {
    EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << m;
  }
  EXPECT_FALSE(ParseTopology("between_regions: 3\nhosts:\n  - {name: a}\n").ok());
}

TEST(RegionsTest, EachRegionHostFiltersTheOtherRegionsIntoTheSlowClass) {
  absl::StatusOr<Topology> t = ParseTopology(kTopology);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> tc;  // every tc command, without "tc -n"
  Network net(*t, [&](const std::vector<std::string>& argv) {
    if (argv[0] == "tc") tc.push_back(absl::StrJoin(argv.begin() + 2, argv.end(), " "));
    return absl::OkStatus();
  });
  ASSERT_TRUE(net.Up().ok());
  auto has = [&](const std::string& cmd) { return std::find(tc.begin(), tc.end(), cmd) != tc.end(); };
  auto count = [&](const std::string& part) {
    return std::count_if(tc.begin(), tc.end(), [&](const std::string& c) { return c.find(part) != std::string::npos; });
  };
  // a1 (east, 200 Mbit/s): htb at its own rate by default; a class to b1 (host 3, 10.82.0.5) at
  // 4 Mbit/s with a 400 ms byte queue (4 Mbit/s x 0.4 s = 200 kB) and b1's address filtered into
  // it; a2 (same region) and coord (no region) get none.
  EXPECT_TRUE(has("rg-a1 qdisc add dev eth0 root handle 1: htb default 10")) << absl::StrJoin(tc, "\n");
  EXPECT_TRUE(has("rg-a1 class add dev eth0 parent 1: classid 1:1 htb rate 200mbit quantum 60000"));
  EXPECT_TRUE(has("rg-a1 class add dev eth0 parent 1:1 classid 1:10 htb rate 200mbit quantum 60000"));
  EXPECT_TRUE(has("rg-a1 qdisc add dev eth0 parent 1:10 handle 10: bfifo limit 10000000"));
  EXPECT_TRUE(has("rg-a1 class add dev eth0 parent 1:1 classid 1:103 htb rate 4mbit quantum 50000"));
  EXPECT_TRUE(has("rg-a1 qdisc add dev eth0 parent 1:103 handle 103: bfifo limit 200000"));
  EXPECT_TRUE(has("rg-a1 filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.82.0.5/32 flowid 1:103"));
  EXPECT_EQ(count("rg-a1 filter add"), 1);
  EXPECT_EQ(count("rg-a1 class add"), 3);
  // b1 (west, unlimited): a class per east host.
  EXPECT_TRUE(has("rg-b1 class add dev eth0 parent 1: classid 1:1 htb rate 100000mbit quantum 60000"));
  EXPECT_EQ(count("rg-b1 filter add"), 2);
  EXPECT_TRUE(has("rg-b1 filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.82.0.3/32 flowid 1:101"));
  EXPECT_TRUE(has("rg-b1 filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.82.0.4/32 flowid 1:102"));
  EXPECT_EQ(count("rg-b1 qdisc add dev eth0 parent 1:10 "), 0);  // unlimited: the default queue
  // The coordinator's host has no region: no shaping at all; a1's download keeps its tbf.
  EXPECT_EQ(count("rg-coord "), 0);
  EXPECT_EQ(count("rg-sw qdisc add dev rg-a1-s root tbf rate 200mbit"), 1);
  EXPECT_FALSE(net.SetRate(10).ok());
}

// goodput in Mbit/s from host `from` to a sink on `to` (longhaul-netem source and sink).
absl::StatusOr<double> Goodput(const std::string& topo_file, const Topology& t, const std::string& from,
                               const std::string& to, int64_t bytes, const std::string& dir) {
  const std::string tool = cluster::Cluster::Bin("longhaul-netem");
  auto sink = cluster::Process::Spawn({"/usr/sbin/ip", "netns", "exec", t.Namespace(to), tool, "sink", "--port=5002"},
                                      absl::StrCat(dir, "/sink-", to, ".log"));
  if (!sink.ok()) return sink.status();
  auto [rc, out] = cluster::Cluster::Run(absl::StrCat(tool, " exec ", topo_file, " ", from, " -- ", tool,
                                                      " source --to=", t.Address(to), ":5002 --bytes=", bytes));
  (*sink)->Signal(SIGKILL);
  if (rc != 0) return absl::InternalError(out);
  const size_t at = out.find("\"mbit_per_s\":");
  double mbit = 0;
  if (at == std::string::npos || !absl::SimpleAtod(out.substr(at + 13, out.find('}', at) - at - 13), &mbit)) {
    return absl::InternalError(absl::StrCat("no mbit_per_s in: ", out));
  }
  return mbit;
}

TEST(RegionsTest, TheLinkBetweenRegionsDeliversItsRateAndTheOneInsideIsFast) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces and tc (CI runs as root)";
  char dir[] = "/tmp/longhaul-regions-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = absl::StrCat(dir, "/t.yaml");
  FILE* f = std::fopen(file.c_str(), "w");
  std::fputs(kTopology, f);
  std::fclose(f);
  absl::StatusOr<Topology> t = ParseTopology(kTopology);
  ASSERT_TRUE(t.ok());
  Network net(*t, RunCommand);
  (void)net.Down();  // leftovers of an aborted run
  ASSERT_TRUE(net.Up().ok());
  // 1 MB at 4 Mbit/s: 2 s; 8 MB inside the region at 200 Mbit/s: 0.3 s.
  absl::StatusOr<double> between = Goodput(file, *t, "a1", "b1", 1'000'000, dir);
  absl::StatusOr<double> inside = Goodput(file, *t, "a1", "a2", 8'000'000, dir);
  absl::StatusOr<double> back = Goodput(file, *t, "b1", "a2", 1'000'000, dir);
  EXPECT_TRUE(net.Down().ok());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(between.ok()) << between.status();
  ASSERT_TRUE(inside.ok()) << inside.status();
  ASSERT_TRUE(back.ok()) << back.status();
  std::printf("a1 -> b1 (between regions) %.2f Mbit/s, b1 -> a2 %.2f Mbit/s, a1 -> a2 (inside) %.1f Mbit/s\n", *between,
              *back, *inside);
  // (htb lets a class's burst through at once: a few kB above the rate over a 2 s transfer.)
  EXPECT_GE(*between, 0.85 * 4);
  EXPECT_LE(*between, 1.05 * 4);
  EXPECT_GE(*back, 0.85 * 4);
  EXPECT_LE(*back, 1.05 * 4);
  EXPECT_GE(*inside, 0.8 * 200);
  EXPECT_LE(*inside, 1.0 * 200);
}

}  // namespace
}  // namespace longhaul::netem
