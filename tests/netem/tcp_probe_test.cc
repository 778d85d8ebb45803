// The plain-TCP probe on loopback: timed sends, RTT + throughput probes, the per-probe cap, and a
// sink that survives garbage and keeps serving.
#include "netem/tcp_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"

namespace longhaul::netem {
namespace {

// A sink serving `connections` probes on its own thread, joined at the end of the test.
struct RunningSink {
  explicit RunningSink(int connections, int64_t cap = kDefaultMaxProbeBytes) {
    absl::StatusOr<TcpSink> s = TcpSink::Listen("127.0.0.1", 0, cap);
    EXPECT_TRUE(s.ok()) << s.status();
    port = s->port();
    server = std::thread([s = std::move(*s), connections]() mutable { s.Serve(connections); });
  }
  ~RunningSink() { server.join(); }
  int port = 0;
  std::thread server;
};

TEST(TcpProbe, TimedSendIsConfirmed) {
  RunningSink sink(2);
  absl::StatusOr<double> s = TimedTcpSend("127.0.0.1", sink.port, 8 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(*s, 0.0);
  absl::StatusOr<double> empty = TimedTcpSend("127.0.0.1", sink.port, 0);
  EXPECT_TRUE(empty.ok()) << empty.status();
}

// The probe's sender may take a congestion control of its own (the emulated hosts' one): reno is
// always allowed; a name the kernel does not have is an error naming it.
TEST(TcpProbe, TimedSendTakesTheCongestionControlItIsGiven) {
  RunningSink sink(2);
  absl::StatusOr<double> reno = TimedTcpSend("127.0.0.1", sink.port, 1 << 20, absl::ZeroDuration(), "reno");
  ASSERT_TRUE(reno.ok()) << reno.status();
  absl::StatusOr<double> bad = TimedTcpSend("127.0.0.1", sink.port, 1 << 20, absl::ZeroDuration(), "nosuchcc");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"nosuchcc\""), std::string_view::npos) << bad.status();
}

// The kernel paces a socket it is told to pace: 4 MiB at 80 Mbit/s (10 MB/s) take at least about
// 0.35 s even over loopback (the first ten segments, up to 640 KiB there, leave unpaced; a lower
// bound: a correctness property, not a speed assertion); a pace outside the option's range is an
// error naming it.
TEST(TcpProbe, TimedSendIsPacedWhenAsked) {
  RunningSink sink(1);  // the bad pace is refused before connecting
  absl::StatusOr<double> paced = TimedTcpSend("127.0.0.1", sink.port, 4 << 20, absl::ZeroDuration(), "", 80);
  ASSERT_TRUE(paced.ok()) << paced.status();
  EXPECT_GE(*paced, 0.3);
  absl::StatusOr<double> bad = TimedTcpSend("127.0.0.1", sink.port, 1 << 20, absl::ZeroDuration(), "", -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pace -1 Mbit/s"), std::string_view::npos) << bad.status();
}

TEST(TcpProbe, ProbeMeasuresRoundTripAndThroughput) {
  RunningSink sink(1);
  absl::StatusOr<LinkMeasurement> m = ProbeLink("127.0.0.1", sink.port, {.bytes = 4 << 20, .pings = 7});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->rtt, absl::ZeroDuration());
  EXPECT_LT(m->rtt, absl::Seconds(1));
  EXPECT_GT(m->mbit_per_s, 1.0);  // loopback: far more, whatever the machine's load
  EXPECT_EQ(m->bytes, 4 << 20);
}

TEST(TcpProbe, ProbesAboveTheCapAreRefusedAndTheSinkGoesOn) {
  RunningSink sink(2, /*cap=*/1 << 20);
  absl::StatusOr<LinkMeasurement> big = ProbeLink("127.0.0.1", sink.port, {.bytes = 2 << 20});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("refused"), std::string_view::npos) << big.status();
  absl::StatusOr<LinkMeasurement> small = ProbeLink("127.0.0.1", sink.port, {.bytes = 1 << 20});
  EXPECT_TRUE(small.ok()) << small.status();
}

TEST(TcpProbe, GarbageHeadersAreRefusedAndTheSinkGoesOn) {
  RunningSink sink(3);
  for (const char* junk : {"GET / HTTP/1.1\r\n\r\n", "xy"}) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(sink.port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_GT(write(fd, junk, strlen(junk)), 0);
    shutdown(fd, SHUT_WR);  // a short header: the sink sees the end of the stream
    char buf[16];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }
  absl::StatusOr<LinkMeasurement> m = ProbeLink("127.0.0.1", sink.port, {.bytes = 1 << 16, .pings = 1});
  EXPECT_TRUE(m.ok()) << m.status();
}

TEST(TcpProbe, BadArgumentsAreClearErrors) {
  EXPECT_EQ(ProbeLink("not-an-ip", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProbeLink("127.0.0.1", 1, {.bytes = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProbeLink("127.0.0.1", 1, {.pings = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpSink::Listen("127.0.0.1", 70000).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing listens on port 1: a clear "cannot connect", not a hang.
  absl::StatusOr<double> s = TimedTcpSend("127.0.0.1", 1, 10);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot connect"), std::string_view::npos) << s.status();
}

}  // namespace
}  // namespace longhaul::netem
