// longhaul-bench transport: goodput of the real data-plane path (LinkSender -> gRPC StageLink
// stream -> StageLinkService reassembly, CRC check and decode -> Inbox) between two processes,
// against a plain TCP socket between the same two processes in the same run.
//
// The receiving process is this binary re-executed with --serve (Boost.Process: fork and exec, so
// it starts with a clean gRPC and LibTorch): it listens on a gRPC port and a TCP port, prints both
// on stdout, consumes whatever arrives, and exits when its stdin closes.
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <limits>
#include <thread>
#include <vector>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "codec/codec.h"
#include "netem/tcp_probe.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "worker/inbox.h"
#include "worker/link_sender.h"
#include "worker/link_service.h"

namespace longhaul::bench {
namespace {

namespace bp = boost::process;

using Clock = std::chrono::steady_clock;

class Router : public worker::InboxRouter {
 public:
  Router() : inbox_(std::make_shared<worker::Inbox>(8, "bench sender")) {}
  absl::StatusOr<std::shared_ptr<worker::Inbox>> Find(uint64_t, int, int, absl::Duration) override { return inbox_; }
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
  b.RegisterCallbackGenericService(&svc);
  auto server = b.BuildAndStart();

  // The benchmark's own sink on loopback: as many bytes as the run sends.
  absl::StatusOr<netem::TcpSink> sink = netem::TcpSink::Listen("127.0.0.1", 0, std::numeric_limits<int64_t>::max());
  if (!sink.ok()) return 1;
  std::printf("%d %d\n", gport, sink->port());
  std::fflush(stdout);
  std::thread([s = std::move(*sink)]() mutable { s.Serve(); }).detach();
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

struct Flags {
  int64_t bytes = int64_t{1} << 30, frame_bytes = 4 << 20, streams = 2;
  std::string codec = "fp32";
  bool json = false, serve = false;
};

int Run(const Flags& f, const CLI::App& cmd) {
  common::TuneAllocatorForLargeFrames();  // as longhaul-worker does
  if (f.serve) return Serve();
  if (f.bytes < 4 || f.frame_bytes < 4 || f.frame_bytes > (256 << 20)) {
    return common::FlagError(cmd, "--bytes and --frame-bytes need positive integers (frames at most 256 MiB)");
  }
  if (f.streams < 1 || f.streams > worker::kMaxStripes) {
    return common::FlagError(cmd, absl::StrCat("--streams must be 1..", worker::kMaxStripes));
  }
  auto codec = codec::MakeCodec(f.codec);
  if (!codec.ok()) return common::FlagError(cmd, std::string(codec.status().message()));
  const bool json = f.json;

  // The receiver: this binary with --serve, stdin and stdout on pipes.
  bp::opstream child_in;
  bp::ipstream child_out;
  std::error_code ec;
  bp::child child(bp::exe = "/proc/self/exe", bp::args = {"transport", "--serve"}, bp::std_in < child_in,
                  bp::std_out > child_out, ec);
  if (ec) {
    std::fprintf(stderr, "longhaul-bench transport: cannot start the receiver process: %s\n", ec.message().c_str());
    return 1;
  }
  int gport = 0, tport = 0;
  if (!(child_out >> gport >> tport)) {
    std::fprintf(stderr, "longhaul-bench transport: the receiver process did not start\n");
    return 1;
  }

  const int64_t elems = f.frame_bytes / 4;
  const int64_t frames = (f.bytes + f.frame_bytes - 1) / f.frame_bytes;
  torch::Tensor t = torch::randn({elems});
  worker::SenderOptions o;
  o.target = absl::StrCat("127.0.0.1:", gport);
  o.peer = "bench receiver";
  o.job_id = 1;
  o.queue_capacity = 4;
  o.streams = static_cast<int>(f.streams);
  auto sender = worker::LinkSender::Start(o, codec->get());
  if (!sender.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: %s\n", std::string(sender.status().message()).c_str());
    return 1;
  }
  const double c0 = CpuSeconds(child.id());
  const auto g0 = Clock::now();
  absl::Status st;
  for (int64_t i = 0; i < frames && st.ok(); ++i) {
    stage_runtime::LinkMessage m;
    m.step = 1;
    m.micro_batch = static_cast<int>(i);
    m.tensor = t;
    st = (*sender)->Send(std::move(m), false);
  }
  if (st.ok()) st = (*sender)->Finish();
  const double grpc_s = std::chrono::duration<double>(Clock::now() - g0).count();
  const double c1 = CpuSeconds(child.id());
  const int64_t grpc_bytes = frames * elems * 4;
  const int64_t wire = (*sender)->stats().wire_bytes;
  if (!st.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: gRPC run failed: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const absl::StatusOr<double> tcp = netem::TimedTcpSend("127.0.0.1", tport, grpc_bytes);
  const double c2 = CpuSeconds(child.id());
  child_in.pipe().close();  // the receiver's stdin: it exits
  child.wait(ec);
  if (!tcp.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: TCP run failed: %s\n", std::string(tcp.status().message()).c_str());
    return 1;
  }
  const double tcp_s = *tcp;
  const double grpc_gbps = grpc_bytes * 8 / grpc_s / 1e9, tcp_gbps = grpc_bytes * 8 / tcp_s / 1e9;
  const double gib = grpc_bytes / 1073741824.0;
  const double grpc_cpu = (c1 - c0) / gib, tcp_cpu = (c2 - c1) / gib;
  if (json) {
    const nlohmann::ordered_json out = {
        {"bytes", grpc_bytes},
        {"frame_bytes", elems * 4},
        {"codec", (*codec)->spec()},
        {"streams", (*sender)->streams()},
        {"wire_bytes", wire},
        {"grpc_gbps", Round(grpc_gbps, 4)},
        {"tcp_gbps", Round(tcp_gbps, 4)},
        {"ratio", Round(grpc_gbps / tcp_gbps, 4)},
        {"grpc_seconds", Round(grpc_s, 4)},
        {"tcp_seconds", Round(tcp_s, 4)},
        {"grpc_cpu_s_per_gib", Round(grpc_cpu, 3)},
        {"tcp_cpu_s_per_gib", Round(tcp_cpu, 3)},
    };
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("payload %.2f GiB in frames of %.1f MiB (%s), %d gRPC stream(s)\n", grpc_bytes / 1073741824.0,
                elems * 4 / 1048576.0, (*codec)->spec().c_str(), (*sender)->streams());
    std::printf("  gRPC data plane: %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB)\n", grpc_gbps, grpc_s, grpc_cpu);
    std::printf("  plain TCP:       %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB)\n", tcp_gbps, tcp_s, tcp_cpu);
    std::printf("  ratio gRPC/TCP:  %8.3f\n", grpc_gbps / tcp_gbps);
  }
  return 0;
}

}  // namespace

BenchmarkRun AddTransportBench(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "transport", "goodput of the gRPC data plane vs a plain TCP socket, two processes");
  cmd->add_option("--bytes", f->bytes, "payload bytes to stream, each way")->type_name("N");
  cmd->add_option("--frame-bytes", f->frame_bytes, "bytes of fp32 tensor per frame (at most 256 MiB)")
      ->type_name("N");
  cmd->add_option("--codec", f->codec, "codec of the frames")->type_name("SPEC");
  cmd->add_option("--streams", f->streams,
                  absl::StrCat("gRPC streams (TCP connections) the link is striped over, 1..", worker::kMaxStripes,
                               ": the job spec's links.streams"))
      ->type_name("N");
  cmd->add_flag("--json", f->json, "one JSON object instead of a summary");
  // Shown rather than hidden: CLI11 2.1 pads the help with a blank line for a hidden group.
  cmd->add_flag("--serve", f->serve, "internal: run as the receiving process (the benchmark starts its own)");
  cmd->footer(
      "Streams --bytes of fp32 tensor data (frames of --frame-bytes, encoded with --codec) from this\n"
      "process to a second process over the real gRPC data plane, then the same number of bytes over\n"
      "one plain TCP socket, and prints both goodputs (payload bits per second) and their ratio.\n"
      "--streams defaults to 2, what a fast link (datacenter, loopback) should be given: one stream's\n"
      "threads cap a link near 30 Gbit/s. Jobs default to 1, right for rate-limited WAN links\n"
      "(docs/training-job.md); --streams=1 measures that.\n"
      "Also reports the CPU time both processes used in each phase (user + system, all threads), as\n"
      "CPU seconds per GiB: on a machine with few cores both paths are CPU-bound and this is what\n"
      "decides the ratio.\n"
      "JSON fields: bytes, frame_bytes, codec, streams, wire_bytes, grpc_gbps, tcp_gbps, ratio,\n"
      "grpc_seconds, tcp_seconds, grpc_cpu_s_per_gib, tcp_cpu_s_per_gib.");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
