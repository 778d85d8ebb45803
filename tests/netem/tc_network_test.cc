// longhaul-netem: topology parsing (always), and a real network of namespaces + veth + bridge + tc
// when running as root (skipped with the reason otherwise; CI on these machines runs as root).
#include "netem/tc/network.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "netem/tc/claim.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::netem {
namespace {

TEST(TopologyTest, ParsesHostsAndAddresses) {
  auto t = ParseTopology("name: x\nsubnet: 10.9.8\nhosts:\n  - {name: a, rate_mbit: 50, delay_ms: 10, jitter_ms: 1}\n"
                         "  - {name: b, queue_ms: 2000}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Namespace("a"), "x-a");
  EXPECT_EQ(t->hosts[0].queue_ms, 400);
  EXPECT_EQ(t->hosts[1].queue_ms, 2000);
  EXPECT_EQ(t->Address("a"), "10.9.8.2");
  EXPECT_EQ(t->Address("b"), "10.9.8.3");
  EXPECT_EQ(t->Address("z"), "");
  EXPECT_EQ(t->hosts[0].rate_mbit, 50);
}

TEST(TopologyTest, ListsEveryProblem) {
  auto t = ParseTopology("name: toolongname\nsubnet: 300.1\ncolour: red\nhosts:\n  - {name: a, rate_mbit: -1}\n"
                         "  - {name: a, jitter_ms: 5, queue_ms: 0}\n  - {name: sw, loss: 0.9, mtu: 9000}\n");
  ASSERT_FALSE(t.ok());
  const std::string m(t.status().message());
  for (const char* want : {"name: \"toolongname\"", "subnet", "colour: unknown key", "hosts[0].rate_mbit",
                           "hosts[1].name: \"a\" is repeated", "hosts[1].jitter_ms", "hosts[1].queue_ms", "reserved", "hosts[2].loss",
                           "hosts[2].mtu: unknown key"}) {
    EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << m;
  }
  EXPECT_FALSE(ParseTopology("hosts: []\n").ok());
  EXPECT_FALSE(ParseTopology("[1, 2]").ok());
}

TEST(TopologyTest, UpRollsBackWhenAStepFails) {
  auto t = ParseTopology("name: rb\nhosts:\n  - {name: a, rate_mbit: 10}\n  - {name: b}\n");
  ASSERT_TRUE(t.ok());
  std::vector<std::string> log;
  int calls = 0;
  Network net(*t, [&](const std::vector<std::string>& argv) {
    log.push_back(absl::StrCat(argv[0], " ", argv[1], " ", argv[2], " ", argv.size() > 3 ? argv[3] : ""));
    return ++calls == 8 ? absl::InternalError("boom") : absl::OkStatus();
  });
  absl::Status s = net.Up();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("removed"), std::string::npos) << s;
  // The last commands delete every namespace of the topology.
  ASSERT_GE(log.size(), 3u);
  EXPECT_EQ(log[log.size() - 3], "ip netns del rb-sw");
  EXPECT_EQ(log.back(), "ip netns del rb-b");
}

TEST(TopologyTest, TbfQueuesEachHostsQueueMsAtUpAndSetRate) {
  auto t = ParseTopology("name: q\nhosts:\n  - {name: a, rate_mbit: 10, queue_ms: 1500}\n  - {name: b, rate_mbit: 10}\n");
  ASSERT_TRUE(t.ok());
  std::vector<std::string> tbf;  // "<namespace> <dev> <latency>" of every tbf added
  Network net(*t, [&](const std::vector<std::string>& argv) {
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "latency") tbf.push_back(absl::StrCat(argv[2], " ", argv[6], " ", argv[i + 1]));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(net.Up().ok());
  EXPECT_EQ(tbf, (std::vector<std::string>{"q-a eth0 1500ms", "q-sw q-a-s 1500ms", "q-b eth0 400ms", "q-sw q-b-s 400ms"}));
  tbf.clear();
  ASSERT_TRUE(net.SetRate(2).ok());
  EXPECT_EQ(tbf, (std::vector<std::string>{"q-a eth0 1500ms", "q-sw q-a-s 1500ms", "q-b eth0 400ms", "q-sw q-b-s 400ms"}));
}

// Every host namespace gets the topology's congestion control (cubic unless it says otherwise),
// none with "host", and a name that cannot be one is a listed problem.
TEST(TopologyTest, HostsGetTheTopologysTcpCongestionControl) {
  auto routes = [](const Topology& t) {
    std::vector<std::string> seen;  // "<namespace> <route> congctl <algorithm>"
    Network net(t, [&](const std::vector<std::string>& argv) {
      if (argv.size() > 4 && argv[3] == "route") {
        seen.push_back(absl::StrCat(argv[2], " ", argv[5], " ", argv[argv.size() - 2], " ", argv.back()));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(net.Up().ok());
    return seen;
  };
  auto t = ParseTopology("name: cc\nhosts:\n  - {name: a, rate_mbit: 10}\n  - {name: b}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tcp_congestion, "cubic");
  EXPECT_EQ(routes(*t), (std::vector<std::string>{"cc-a 10.77.0.0/24 congctl cubic", "cc-b 10.77.0.0/24 congctl cubic"}));
  t = ParseTopology("name: cc\ntcp_congestion: reno\nhosts:\n  - {name: a}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(routes(*t), (std::vector<std::string>{"cc-a 10.77.0.0/24 congctl reno"}));
  t = ParseTopology("name: cc\ntcp_congestion: host\nhosts:\n  - {name: a}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(routes(*t).empty());
  t = ParseTopology("name: cc\ntcp_congestion: \"cubic; reboot\"\nhosts:\n  - {name: a}\n");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tcp_congestion: \"cubic; reboot\""), std::string::npos) << t.status();
}

TEST(TopologyTest, QdiscCountersAreParsedFromTcOutput) {
  auto c = ParseQdiscCounters("qdisc tbf 876d: dev eth0 root refcnt 3 rate 2Mbit burst 3200b lat 400ms \n"
                              " Sent 1391436 bytes 2225 pkt (dropped 101, overlimits 2118 requeues 0) \n"
                              " backlog 0b 0p requeues 0\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes, 1391436);
  EXPECT_EQ(c->packets, 2225);
  EXPECT_EQ(c->drops, 101);
  EXPECT_FALSE(ParseQdiscCounters("").ok());
  EXPECT_FALSE(ParseQdiscCounters("qdisc tbf 1: dev eth0 root\n Sent lots of bytes\n").ok());
  // Network::Counters asks for each host's two root qdiscs and fails with tc's problem.
  auto t = ParseTopology("name: q\nhosts:\n  - {name: a, rate_mbit: 10}\n");
  ASSERT_TRUE(t.ok());
  std::vector<std::string> asked;
  Network net(*t, [](const std::vector<std::string>&) { return absl::OkStatus(); },
              [&](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
                asked.push_back(absl::StrJoin(argv, " "));
                return std::string(" Sent 10 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n");
              });
  auto hc = net.Counters();
  ASSERT_TRUE(hc.ok()) << hc.status();
  EXPECT_EQ(asked, (std::vector<std::string>{"tc -s -n q-a qdisc show dev eth0 root", "tc -s -n q-sw qdisc show dev q-a-s root"}));
  EXPECT_EQ((*hc)[0].up.bytes, 10);
  Network broken(*t, [](const std::vector<std::string>&) { return absl::OkStatus(); },
                 [](const std::vector<std::string>&) -> absl::StatusOr<std::string> { return absl::InternalError("no tc"); });
  EXPECT_FALSE(broken.Counters().ok());
}

// The runners of ip and tc: stdout and stderr are read at the same time, so a child that fills its
// stderr pipe while we read its stdout (or the reverse) finishes.
TEST(RunCommandTest, ReadsBothPipesAtOnceAndCapsStdout) {
  absl::StatusOr<std::string> out =
      RunCommandOutput({"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' e >&2; echo hello"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "hello\n");
  absl::StatusOr<std::string> big = RunCommandOutput({"sh", "-c", "head -c 3000000 /dev/zero"});
  ASSERT_TRUE(big.ok()) << big.status();  // the rest is read and dropped: no SIGPIPE, exit status 0
  EXPECT_EQ(big->size(), size_t{1} << 20);
  EXPECT_TRUE(RunCommand({"true"}).ok());
}

TEST(RunCommandTest, FailuresCarryTheCommandAndItsStderr) {
  absl::Status s = RunCommand({"sh", "-c", "echo doomed >&2; exit 3"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("`sh -c echo doomed >&2; exit 3` failed: doomed"), std::string::npos) << s;
  absl::Status missing = RunCommand({"longhaul-no-such-command"});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("longhaul-no-such-command"), std::string::npos) << missing;
}

// cluster::Process and Cluster::Run, which the tests and the sweep start processes with.
TEST(ProcessTest, LogsExitCodesAndSignals) {
  char dir[] = "/tmp/longhaul-process-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log = absl::StrCat(dir, "/p.log");
  auto p = cluster::Process::Spawn({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, log);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Wait(absl::Seconds(10)), 3);
  EXPECT_FALSE((*p)->running());
  // A second process appends to the same log.
  auto q = cluster::Process::Spawn({"/bin/sh", "-c", "echo again; exec sleep 60"}, log);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE((*q)->running());
  EXPECT_EQ((*q)->Wait(absl::Milliseconds(100)), -1);
  (*q)->Signal(SIGTERM);
  EXPECT_EQ((*q)->Wait(absl::Seconds(10)), 128 + SIGTERM);
  auto [rc, text] = cluster::Cluster::Run(absl::StrCat("cat ", log));
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(text, "out\nerr\nagain\n");
  EXPECT_FALSE(cluster::Process::Spawn({"/no/such/binary"}, log).ok());
  auto [rc2, text2] = cluster::Cluster::Run("echo a; echo b >&2; exit 4");
  EXPECT_EQ(rc2, 4);
  EXPECT_EQ(text2, "a\nb\n");
  std::filesystem::remove_all(dir);
}

std::string Tool() { return cluster::Cluster::Bin("longhaul-netem"); }

TEST(TcNetworkTest, ShapedLinkDeliversNinetyToHundredPercentOfTheRateAndDownCleansUp) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces and tc (CI runs as root)";
  char dir[] = "/tmp/longhaul-netem-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string topo = absl::StrCat(dir, "/t.yaml");
  FILE* f = std::fopen(topo.c_str(), "w");
  std::fputs("name: lhit\nsubnet: 10.78.0\nhosts:\n  - {name: a, rate_mbit: 40}\n  - {name: b, rate_mbit: 40}\n", f);
  std::fclose(f);
  (void)cluster::Cluster::Run(absl::StrCat(Tool(), " down ", topo));  // leftovers of an aborted run
  auto [rc, out] = cluster::Cluster::Run(absl::StrCat(Tool(), " up ", topo));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(std::filesystem::exists("/run/netns/lhit-a"));
  // The hosts' connections take the topology's congestion control (cubic), not the machine's.
  auto [cc_rc, cc] = cluster::Cluster::Run("ip -n lhit-a route show 10.78.0.0/24");
  EXPECT_EQ(cc_rc, 0) << cc;
  EXPECT_NE(cc.find("congctl cubic"), std::string::npos) << cc;
  // A second `up` refuses instead of adopting the namespaces.
  auto [rc_again, out_again] = cluster::Cluster::Run(absl::StrCat(Tool(), " up ", topo));
  EXPECT_NE(rc_again, 0);
  EXPECT_NE(out_again.find("already exists"), std::string::npos) << out_again;
  {
    // A process running on the network claims its name (a sweep): `down` leaves it alone.
    absl::StatusOr<NetworkClaim> claim = NetworkClaim::Acquire("lhit", absl::ZeroDuration());
    ASSERT_TRUE(claim.ok()) << claim.status();
    auto [claimed_rc, claimed_out] = cluster::Cluster::Run(absl::StrCat(Tool(), " down ", topo));
    EXPECT_NE(claimed_rc, 0);
    EXPECT_NE(claimed_out.find(absl::StrCat("in use by process ", getpid())), std::string::npos) << claimed_out;
    EXPECT_TRUE(std::filesystem::exists("/run/netns/lhit-a"));
  }

  auto sink = cluster::Process::Spawn({"/usr/sbin/ip", "netns", "exec", "lhit-b", Tool(), "sink", "--port=5001"},
                                      absl::StrCat(dir, "/sink.log"));
  ASSERT_TRUE(sink.ok());
  // 8 MB at 40 Mbit/s: 1.6 s. Both access links are shaped, the path rate is 40 Mbit/s.
  auto [src_rc, src_out] = cluster::Cluster::Run(
      absl::StrCat(Tool(), " exec ", topo, " a -- ", Tool(), " source --to=10.78.0.3:5001 --bytes=8000000"));
  (*sink)->Signal(SIGKILL);
  ASSERT_EQ(src_rc, 0) << src_out;
  // One JSON object on stdout: {"bytes": ..., "seconds": ..., "mbit_per_s": ...}.
  const size_t at = src_out.find("\"mbit_per_s\":");
  ASSERT_NE(at, std::string::npos) << src_out;
  double mbit = 0;
  const std::string value = src_out.substr(at + 13, src_out.find('}', at) - at - 13);
  ASSERT_TRUE(absl::SimpleAtod(value, &mbit)) << src_out;  // spaces allowed
  EXPECT_GE(mbit, 0.9 * 40) << src_out;
  EXPECT_LE(mbit, 1.0 * 40) << src_out;

  auto [down_rc, down_out] = cluster::Cluster::Run(absl::StrCat(Tool(), " down ", topo));
  EXPECT_EQ(down_rc, 0) << down_out;
  EXPECT_FALSE(std::filesystem::exists("/run/netns/lhit-a"));
  EXPECT_FALSE(std::filesystem::exists("/run/netns/lhit-sw"));
  std::filesystem::remove_all(dir);
}

// The sweep's probe: one TCP connection from the root namespace through a host's shaped download
// gets 0.9-1.0 of the rate, and its sockets do not keep the namespace (or the uplink veth) alive.
TEST(TcNetworkTest, GoodputProbeMeasuresTheShapedLinkAndLeavesNothingBehind) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces and tc (CI runs as root)";
  absl::StatusOr<Topology> t = ParseTopology("name: lhgp\nsubnet: 10.77.0\nhosts:\n  - {name: a}\n  - {name: b}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  Network net(*t, RunCommand);
  (void)net.Down();
  ASSERT_TRUE(net.Up().ok());
  ASSERT_TRUE(net.SetRate(40).ok());
  absl::StatusOr<double> mbit = net.TcpGoodputTo("b", 6'000'000);  // 1.2 s at 40 Mbit/s
  ASSERT_TRUE(mbit.ok()) << mbit.status();
  EXPECT_GE(*mbit, 0.9 * 40);
  EXPECT_LE(*mbit, 1.0 * 40);
  // The qdisc counters saw the probe's bytes (plus headers) go down to b, its ACKs go up, nothing
  // to a, nothing dropped.
  absl::StatusOr<std::vector<HostCounters>> c = net.Counters();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[1].host, "b");
  EXPECT_GE((*c)[1].down.bytes, 6'000'000);
  EXPECT_LE((*c)[1].down.bytes, 6'600'000);
  EXPECT_GT((*c)[1].up.packets, 0);
  EXPECT_LT((*c)[1].up.bytes, 600'000);
  EXPECT_LT((*c)[0].down.bytes, 10'000);
  EXPECT_EQ((*c)[1].down.drops, 0);
  EXPECT_FALSE(net.TcpGoodputTo("nosuchhost", 1000).ok());
  ASSERT_TRUE(net.Down().ok());
  EXPECT_FALSE(std::filesystem::exists("/run/netns/lhgp-b"));
  EXPECT_NE(std::system("ip link show lhgp-up >/dev/null 2>&1"), 0) << "the uplink veth outlived Down()";
}

}  // namespace
}  // namespace longhaul::netem
