// The worker's link prober (worker/link_prober.h) against real probe sinks on loopback: every peer
// measured (a calibration probe, then a sized one), the per-probe cap and the total budget kept,
// no probing while busy, failures reported, a sink stopped from another thread; and two workers
// probing each other never at the same time (sinks with the busy hook, here in the test).
#include "worker/link_prober.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
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
  s.busy_patience = absl::Milliseconds(500);  // a refusal is retried as "busy" until then
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
      EXPECT_GE(prober.refusals(), 1);  // retried first (it could have been busy), then reported
    } else if (who == "bad") {
      EXPECT_NE(r.error().find("bad probe address"), std::string::npos) << r.error();
    }
  }
}

// A probe sink speaking netem/tcp_probe.h's protocol with the busy hook a worker's sink gets
// (link_prober.h): a probe from a host that `busy` names is refused like one above the cap. It
// records when it served each probe's transfer.
class BusySink {
 public:
  explicit BusySink(std::function<bool(const std::string&)> busy) : busy_(std::move(busy)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~BusySink() {
    shutdown(fd_, SHUT_RDWR);  // ends accept()
    thread_.join();
    close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::pair<absl::Time, absl::Time>> served() {
    absl::MutexLock l(&mu_);
    return served_;
  }
  int refused() {
    absl::MutexLock l(&mu_);
    return refused_;
  }

 private:
  static bool Read(int c, void* p, size_t n) {
    for (size_t got = 0; got < n;) {
      const ssize_t k = read(c, static_cast<char*>(p) + got, n - got);
      if (k <= 0) return false;
      got += static_cast<size_t>(k);
    }
    return true;
  }
  static bool Write(int c, const void* p, size_t n) { return write(c, p, n) == static_cast<ssize_t>(n); }

  void Serve() {
    for (;;) {
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      const int c = accept(fd_, reinterpret_cast<sockaddr*>(&from), &len);
      if (c < 0) return;
      char head[16];
      uint32_t pings = 0;
      uint64_t bytes = 0;
      if (Read(c, head, sizeof(head))) {
        std::memcpy(&pings, head + 4, 4);
        std::memcpy(&bytes, head + 8, 8);
        char ip[INET_ADDRSTRLEN] = {};
        inet_ntop(AF_INET, &from.sin_addr, ip, sizeof(ip));
        const bool busy = busy_(ip);
        const uint64_t answer = busy ? ~uint64_t{0} : 0;
        if (busy) {
          absl::MutexLock l(&mu_);
          ++refused_;
        }
        bool ok = Write(c, &answer, sizeof(answer)) && !busy;
        for (uint32_t i = 0; ok && i < pings; ++i) {
          char p;
          ok = Read(c, &p, 1) && Write(c, &p, 1);
        }
        const absl::Time start = absl::Now();
        std::vector<char> buf(64 << 10);
        for (uint64_t got = 0; ok && got < bytes;) {
          const ssize_t k = read(c, buf.data(), std::min<uint64_t>(buf.size(), bytes - got));
          ok = k > 0;
          got += ok ? static_cast<uint64_t>(k) : 0;
        }
        if (ok) {  // recorded before the answer goes out: the prober reports once it has the answer
          absl::MutexLock l(&mu_);
          served_.emplace_back(start, absl::Now());
        }
        if (ok) Write(c, &bytes, sizeof(bytes));
      }
      close(c);
    }
  }

  std::function<bool(const std::string&)> busy_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::pair<absl::Time, absl::Time>> served_ ABSL_GUARDED_BY(mu_);
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(LinkProberTest, ARefusedProbeIsRetriedQuietlyAfterARandomDelay) {
  std::atomic<int> refuse{3};
  BusySink sink([&](const std::string& ip) {
    EXPECT_EQ(ip, "127.0.0.1");
    return refuse.fetch_sub(1) > 0;
  });
  Reports reports;
  ProbeSettings s;
  s.min_probe_bytes = 64 << 10;
  s.max_probe_bytes = 64 << 10;
  s.busy_retry_min = absl::Milliseconds(20);
  s.busy_retry_max = absl::Milliseconds(60);
  LinkProber prober(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { reports.Add(p, r); },
                    [] { return false; });
  const absl::Time t0 = absl::Now();
  prober.SetPeers({{2, "a", sink.address()}});
  ASSERT_TRUE(reports.WaitFor([](const Got& g) { return !g.empty(); }));
  const Got got = reports.Copy();
  ASSERT_EQ(got.size(), 1u);  // the refusals were not reported
  EXPECT_TRUE(got[0].second.error().empty()) << got[0].second.error();
  EXPECT_EQ(sink.refused(), 3);
  EXPECT_EQ(prober.refusals(), 3);
  EXPECT_GE(absl::Now() - t0, 3 * s.busy_retry_min);
  EXPECT_EQ(prober.bytes_sent(), 64 << 10);  // the refused ones are not charged to the budget
  EXPECT_FALSE(prober.ProbingHost("127.0.0.1"));  // nothing in flight now
}

// Two workers that learn of each other at the same moment, each with a sink that refuses the host
// its own prober is probing: their transfers never overlap, and both links are measured, several
// times (every 50 ms).
TEST(LinkProberTest, TwoWorkersNeverProbeEachOtherAtOnce) {
  std::unique_ptr<LinkProber> a, b;
  std::atomic<bool> ready{false};
  auto hook = [&](std::unique_ptr<LinkProber>& own) {
    return [&](const std::string& ip) { return ready && own->ProbingHost(ip); };
  };
  BusySink sink_a(hook(a)), sink_b(hook(b));
  Reports ra, rb;
  ProbeSettings s;
  s.min_probe_bytes = s.max_probe_bytes = 8 << 20;  // tens of ms on loopback: room to overlap
  s.interval = absl::Milliseconds(50);
  s.busy_retry_min = absl::Milliseconds(5);
  s.busy_retry_max = absl::Milliseconds(40);
  a = std::make_unique<LinkProber>(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { ra.Add(p, r); },
                                   [] { return false; });
  b = std::make_unique<LinkProber>(s, [&](const LinkProber::Peer& p, const v1::LinkReport& r) { rb.Add(p, r); },
                                   [] { return false; });
  ready = true;
  a->SetPeers({{2, "b", sink_b.address()}});
  b->SetPeers({{1, "a", sink_a.address()}});
  auto enough = [](const Got& g) { return Count(g, "a", true) + Count(g, "b", true) >= 8; };
  ASSERT_TRUE(ra.WaitFor(enough));
  ASSERT_TRUE(rb.WaitFor(enough));
  a->Stop();
  b->Stop();
  for (const Got& g : {ra.Copy(), rb.Copy()}) {
    for (const auto& [who, r] : g) EXPECT_TRUE(r.error().empty()) << who << ": " << r.error();
  }
  // sink_a served b's probes, sink_b a's: no transfer of one overlaps one of the other.
  const auto by_b = sink_a.served(), by_a = sink_b.served();
  EXPECT_GE(by_b.size(), 8u);
  EXPECT_GE(by_a.size(), 8u);
  for (const auto& [s1, e1] : by_b) {
    for (const auto& [s2, e2] : by_a) EXPECT_TRUE(e1 <= s2 || e2 <= s1) << "overlapping probes";
  }
  std::printf("%d + %d probes, %lld + %lld refused as busy and retried\n", static_cast<int>(by_a.size()),
              static_cast<int>(by_b.size()), static_cast<long long>(a->refusals()),
              static_cast<long long>(b->refusals()));
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
