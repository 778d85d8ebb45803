// The worker's link prober (worker/link_prober.h) against real probe sinks on loopback: every peer
// measured (a calibration probe, then a sized one), the per-probe cap and the total budget kept,
// no probing while busy, failures reported, a sink stopped from another thread.
#include "worker/link_prober.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "netem/tcp_probe.h"

namespace longhaul::worker {
namespace {

// A probe sink serving on its own thread until the end of the test.
struct Sink {
  explicit Sink(int64_t cap = int64_t{64} << 20) {
    absl::StatusOr<netem::TcpSink> s = netem::TcpSink::Listen("127.0.0.1", 0, cap);
    EXPECT_TRUE(s.ok()) << s.status();
    sink = std::make_unique<netem::TcpSink>(std::move(*s));
    thread = std::thread([this] { sink->Serve(); });
  }
  ~Sink() {
    sink->Stop();
    thread.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", sink->port()); }
  std::unique_ptr<netem::TcpSink> sink;
  std::thread thread;
};

// Collects reports.
struct Reports {
  void Add(const LinkProber::Peer& p, const v1::LinkReport& r) {
    absl::MutexLock l(&mu);
    got.emplace_back(p.name, r);
  }
  // Waits until `pred` holds over the reports (or 20 s passed); returns whether it did.
  template <typename Pred>
  bool WaitFor(Pred pred) {
    absl::MutexLock l(&mu);
    auto ok = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return pred(got); };
    return mu.AwaitWithTimeout(absl::Condition(&ok), absl::Seconds(20));
  }
  std::vector<std::pair<std::string, v1::LinkReport>> Copy() {
    absl::MutexLock l(&mu);
    return got;
  }
  absl::Mutex mu;
  std::vector<std::pair<std::string, v1::LinkReport>> got ABSL_GUARDED_BY(mu);
};

using Got = std::vector<std::pair<std::string, v1::LinkReport>>;

int Count(const Got& g, const std::string& name, bool ok) {
  int n = 0;
  for (const auto& [who, r] : g) n += who == name && r.error().empty() == ok;
  return n;
}

TEST(LinkProberTest, EveryPeerIsMeasuredWithACalibrationAndASizedProbe) {
  Sink a, b;
  Reports reports;
  ProbeSettings s;
  s.max_probe_bytes = 4 << 20;
  s.min_probe_bytes = 64 << 10;
  LinkProber prober(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { reports.Add(p, r); },
                    [] { return false; });
  prober.SetPeers({{2, "a", a.address()}, {3, "b", b.address()}});
  ASSERT_TRUE(reports.WaitFor([](const Got& g) { return Count(g, "a", true) >= 2 && Count(g, "b", true) >= 2; }));
  const Got got = reports.Copy();
  for (const auto& [who, r] : got) {
    ASSERT_TRUE(r.error().empty()) << who << ": " << r.error();
    EXPECT_EQ(r.to_worker_id(), who == "a" ? 2u : 3u);
    EXPECT_GT(r.mbit_per_s(), 1.0);
    EXPECT_GT(r.rtt_ms(), 0.0);
    EXPECT_LE(r.bytes(), s.max_probe_bytes);
    EXPECT_GE(r.bytes(), s.min_probe_bytes);
  }
  // The first probe of a peer calibrates (the minimum); loopback is fast, so the next one is as
  // large as allowed.
  EXPECT_EQ(got[0].second.bytes(), s.min_probe_bytes);
  bool sized = false;
  for (const auto& [who, r] : got) sized |= r.bytes() == s.max_probe_bytes;
  EXPECT_TRUE(sized);
  // Then nothing until the interval (10 min) has passed.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(reports.Copy().size(), got.size());
}

TEST(LinkProberTest, TheBudgetBoundsTheTotal) {
  Sink a;
  Reports reports;
  ProbeSettings s;
  s.max_probe_bytes = 1 << 20;
  s.min_probe_bytes = 1 << 20;
  s.interval = absl::Seconds(1);
  s.budget_bytes_per_hour = 3 << 20;  // three probes, then one every 20 minutes
  LinkProber prober(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { reports.Add(p, r); },
                    [] { return false; });
  prober.SetPeers({{2, "a", a.address()}});
  ASSERT_TRUE(reports.WaitFor([](const Got& g) { return g.size() >= 3; }));
  absl::SleepFor(absl::Milliseconds(2500));  // two more intervals
  EXPECT_EQ(reports.Copy().size(), 3u);
  EXPECT_EQ(prober.bytes_sent(), 3 << 20);
}

TEST(LinkProberTest, NothingIsProbedWhileBusy) {
  Sink a;
  Reports reports;
  std::atomic<bool> busy{true};
  LinkProber prober({}, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { reports.Add(p, r); },
                    [&] { return busy.load(); });
  prober.SetPeers({{2, "a", a.address()}});
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_TRUE(reports.Copy().empty());
  EXPECT_EQ(prober.bytes_sent(), 0);
  busy = false;
  EXPECT_TRUE(reports.WaitFor([](const Got& g) { return !g.empty(); }));
}

TEST(LinkProberTest, FailuresAreReportedAndRefusedProbesNamed) {
  Sink small(/*cap=*/100 << 10);
  Reports reports;
  ProbeSettings s;
  s.connect_patience = absl::Milliseconds(100);
  LinkProber prober(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { reports.Add(p, r); },
                    [] { return false; });
  // Port 1 on loopback refuses connections; the small sink refuses the 256 KiB calibration.
  prober.SetPeers({{2, "nobody", "127.0.0.1:1"}, {3, "small", small.address()}, {4, "bad", "no-port"}});
  ASSERT_TRUE(reports.WaitFor([](const Got& g) {
    return Count(g, "nobody", false) >= 1 && Count(g, "small", false) >= 1 && Count(g, "bad", false) >= 1;
  }));
  for (const auto& [who, r] : reports.Copy()) {
    EXPECT_FALSE(r.error().empty());
    if (who == "small") {
      EXPECT_NE(r.error().find("refused"), std::string::npos) << r.error();
    } else if (who == "bad") {
      EXPECT_NE(r.error().find("bad probe address"), std::string::npos) << r.error();
    }
  }
}

TEST(LinkProberTest, ResolvesNamesToIpv4) {
  absl::StatusOr<std::pair<std::string, int>> r = ResolveProbeAddress("localhost:7601");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first, "127.0.0.1");
  EXPECT_EQ(r->second, 7601);
  EXPECT_FALSE(ResolveProbeAddress("localhost").ok());
  EXPECT_FALSE(ResolveProbeAddress("localhost:0").ok());
}

TEST(TcpSinkTest, StopEndsServeFromAnotherThread) {
  absl::StatusOr<netem::TcpSink> s = netem::TcpSink::Listen("127.0.0.1", 0);
  ASSERT_TRUE(s.ok()) << s.status();
  std::atomic<bool> done{false};
  std::thread t([&] {
    s->Serve();
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done);
  s->Stop();
  t.join();
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace longhaul::worker
