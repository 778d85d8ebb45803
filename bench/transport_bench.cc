// longhaul-bench transport: goodput of the real data-plane path (LinkSender -> gRPC StageLink
// stream -> StageLinkService reassembly, CRC check and decode -> Inbox) between two processes,
// against a plain TCP socket between the same two processes in the same run.
//
// The receiving process is this binary re-executed with --serve (posix_spawn, not fork, so it
// starts with a clean gRPC and LibTorch): it listens on a gRPC port and a TCP port, prints both on
// stdout, consumes whatever arrives, and exits when its stdin closes.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "codec/codec.h"
#include "netem/tcp_probe.h"
#include "tools/cli/args.h"
#include "worker/link.h"

extern char** environ;

namespace longhaul::bench {
namespace {

constexpr char kHelp[] =
    "usage: longhaul-bench transport [--bytes=N] [--frame-bytes=N] [--codec=SPEC] [--streams=N] [--json]\n"
    "\n"
    "Streams --bytes of fp32 tensor data (frames of --frame-bytes, default 4 MiB, encoded with\n"
    "--codec, default fp32) from this process to a second process over the real gRPC data plane,\n"
    "then the same number of bytes over one plain TCP socket, and prints both goodputs (payload\n"
    "bits per second) and their ratio. Defaults: --bytes=1073741824.\n"
    "--streams: gRPC streams (TCP connections) the link is striped over, 1-8: the job spec's\n"
    "links.streams. Default 2, what a fast link (datacenter, loopback) should be given: one\n"
    "stream's threads cap a link near 30 Gbit/s. Jobs default to 1, right for rate-limited WAN\n"
    "links (docs/training-job.md); --streams=1 measures that.\n"
    "Also reports the CPU time both processes used in each phase (user + system, all threads), as\n"
    "CPU seconds per GiB: on a machine with few cores both paths are CPU-bound and this is what\n"
    "decides the ratio.\n"
    "JSON fields: bytes, frame_bytes, codec, streams, wire_bytes, grpc_gbps, tcp_gbps, ratio,\n"
    "grpc_seconds, tcp_seconds, grpc_cpu_s_per_gib, tcp_cpu_s_per_gib.\n";

using Clock = std::chrono::steady_clock;

class Router : public worker::InboxRouter {
 public:
  Router() : inbox_(std::make_shared<worker::Inbox>(8, "bench sender")) {}
  absl::StatusOr<std::shared_ptr<worker::Inbox>> Find(uint64_t, int, absl::Duration) override { return inbox_; }
  std::shared_ptr<worker::Inbox> inbox_;
};

// CPU seconds (user + system, all threads) used so far by this process and by `child`.
double CpuSeconds(pid_t child) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  double s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  std::FILE* f = std::fopen(absl::StrCat("/proc/", child, "/stat").c_str(), "r");
  if (f == nullptr) return s;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Fields 14 and 15 (utime, stime, in clock ticks) follow the command name, which ends at the
  // last ')'.
  const char* p = std::strrchr(buf, ')');
  unsigned long long ut = 0, st = 0;
  if (p != nullptr && std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2) {
    s += static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return s;
}

int Serve() {
  Router router;
  worker::StageLinkService svc(&router);
  grpc::ServerBuilder b;
  int gport = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &gport);
  ConfigureLonghaulServer(&b);
  b.RegisterService(&svc);
  auto server = b.BuildAndStart();

  absl::StatusOr<netem::TcpSink> sink = netem::TcpSink::Listen("127.0.0.1", 0);
  if (!sink.ok()) return 1;
  std::printf("%d %d\n", gport, sink->port());
  std::fflush(stdout);
  std::thread([s = *sink]() mutable { s.Serve(); }).detach();
  std::thread consume([&router] {
    for (;;) {
      auto f = router.inbox_->Pop(absl::Hours(1));
      if (!f.ok()) return;
    }
  });
  consume.detach();
  char c;
  while (read(0, &c, 1) > 0) {
  }
  // The parent is done; leave without unwinding the server under the detached threads.
  std::fflush(stdout);
  _exit(0);
}

}  // namespace

int TransportBenchMain(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, {"bytes", "frame-bytes", "codec", "streams", "json", "serve", "help"});
  if (std::optional<int> rc = cli::ExitForParseErrorOrHelp(args, "longhaul-bench transport", kHelp)) return *rc;
  worker::TuneAllocatorForLargeFrames();  // as longhaul-worker does
  if (args->Bool("serve")) return Serve();
  auto bytes = args->Int("bytes", int64_t{1} << 30), frame = args->Int("frame-bytes", 4 << 20);
  auto streams = args->Int("streams", 2);
  if (!bytes.ok() || !frame.ok() || *bytes < 4 || *frame < 4 || *frame > (256 << 20)) {
    std::fprintf(stderr, "longhaul-bench transport: --bytes and --frame-bytes need positive integers "
                         "(frames at most 256 MiB)\n");
    return 2;
  }
  if (!streams.ok() || *streams < 1 || *streams > worker::kMaxStripes) {
    std::fprintf(stderr, "longhaul-bench transport: --streams must be 1..%d\n", worker::kMaxStripes);
    return 2;
  }
  auto codec = codec::MakeCodec(args->Str("codec", "fp32"));
  if (!codec.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: %s\n", std::string(codec.status().message()).c_str());
    return 2;
  }
  const bool json = args->Bool("json");

  // The receiver: this binary with --serve, stdin and stdout on pipes.
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return 1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::string self = "/proc/self/exe";
  std::vector<char*> cargv = {self.data(), const_cast<char*>("transport"), const_cast<char*>("--serve"), nullptr};
  pid_t child;
  if (posix_spawn(&child, self.c_str(), &fa, nullptr, cargv.data(), environ) != 0) {
    std::fprintf(stderr, "longhaul-bench transport: cannot start the receiver process\n");
    return 1;
  }
  close(in[0]);
  close(out[1]);
  FILE* child_out = fdopen(out[0], "r");
  int gport = 0, tport = 0;
  if (std::fscanf(child_out, "%d %d", &gport, &tport) != 2) {
    std::fprintf(stderr, "longhaul-bench transport: the receiver process did not start\n");
    return 1;
  }

  const int64_t elems = *frame / 4;
  const int64_t frames = (*bytes + *frame - 1) / *frame;
  torch::Tensor t = torch::randn({elems});
  worker::SenderOptions o;
  o.target = absl::StrCat("127.0.0.1:", gport);
  o.peer = "bench receiver";
  o.job_id = 1;
  o.queue_capacity = 4;
  o.streams = static_cast<int>(*streams);
  auto sender = worker::LinkSender::Start(o, codec->get());
  if (!sender.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: %s\n", std::string(sender.status().message()).c_str());
    return 1;
  }
  const double c0 = CpuSeconds(child);
  const auto g0 = Clock::now();
  absl::Status st;
  for (int64_t i = 0; i < frames && st.ok(); ++i) st = (*sender)->Send(1, static_cast<int>(i), v1::DIRECTION_FORWARD, t, false);
  if (st.ok()) st = (*sender)->Finish();
  const double grpc_s = std::chrono::duration<double>(Clock::now() - g0).count();
  const double c1 = CpuSeconds(child);
  const int64_t grpc_bytes = frames * elems * 4;
  const int64_t wire = (*sender)->stats().wire_bytes;
  if (!st.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: gRPC run failed: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const absl::StatusOr<double> tcp = netem::TimedTcpSend("127.0.0.1", tport, grpc_bytes);
  const double c2 = CpuSeconds(child);
  close(in[1]);
  int ws;
  waitpid(child, &ws, 0);
  if (!tcp.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: TCP run failed: %s\n", std::string(tcp.status().message()).c_str());
    return 1;
  }
  const double tcp_s = *tcp;
  const double grpc_gbps = grpc_bytes * 8 / grpc_s / 1e9, tcp_gbps = grpc_bytes * 8 / tcp_s / 1e9;
  const double gib = grpc_bytes / 1073741824.0;
  const double grpc_cpu = (c1 - c0) / gib, tcp_cpu = (c2 - c1) / gib;
  if (json) {
    std::printf("{\"bytes\": %lld, \"frame_bytes\": %lld, \"codec\": \"%s\", \"streams\": %d, \"wire_bytes\": %lld, "
                "\"grpc_gbps\": %.4f, \"tcp_gbps\": %.4f, \"ratio\": %.4f, \"grpc_seconds\": %.4f, "
                "\"tcp_seconds\": %.4f, \"grpc_cpu_s_per_gib\": %.3f, \"tcp_cpu_s_per_gib\": %.3f}\n",
                static_cast<long long>(grpc_bytes), static_cast<long long>(elems * 4), (*codec)->spec().c_str(),
                (*sender)->streams(), static_cast<long long>(wire), grpc_gbps, tcp_gbps, grpc_gbps / tcp_gbps, grpc_s, tcp_s, grpc_cpu,
                tcp_cpu);
  } else {
    std::printf("payload %.2f GiB in frames of %.1f MiB (%s), %d gRPC stream(s)\n", grpc_bytes / 1073741824.0,
                elems * 4 / 1048576.0, (*codec)->spec().c_str(), (*sender)->streams());
    std::printf("  gRPC data plane: %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB)\n", grpc_gbps, grpc_s, grpc_cpu);
    std::printf("  plain TCP:       %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB)\n", tcp_gbps, tcp_s, tcp_cpu);
    std::printf("  ratio gRPC/TCP:  %8.3f\n", grpc_gbps / tcp_gbps);
  }
  return 0;
}

}  // namespace longhaul::bench
