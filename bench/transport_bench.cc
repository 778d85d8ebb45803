// longhaul-bench transport: goodput of the real data-plane path (LinkSender -> gRPC StageLink
// stream -> StageLinkService reassembly, CRC check and decode -> Inbox) between two processes,
// against a plain TCP socket between the same two processes in the same run; with --tls, also over
// mutual TLS (the workers' credentials: security/tls.h) in the same run.
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
#include "common/list_dir.h"
#include "common/read_file.h"
#include "security/pki.h"
#include "security/tls.h"
#include "worker/inbox.h"
#include "worker/link_sender.h"
#include "worker/link_service.h"

namespace longhaul::bench {
namespace {

namespace bp = boost::process;

using Clock = std::chrono::steady_clock;

// Job 1: the plaintext run's frames; job 2: the TLS run's (a link's inbox ends with its first run).
class Router : public worker::InboxRouter {
 public:
  Router()
      : inbox_(std::make_shared<worker::Inbox>(8, "bench sender")),
        tls_inbox_(std::make_shared<worker::Inbox>(8, "bench sender (TLS)")) {}
  absl::StatusOr<std::shared_ptr<worker::Inbox>> Find(uint64_t job, int, int, int, absl::Duration) override {
    return job == 2 ? tls_inbox_ : inbox_;
  }
  std::shared_ptr<worker::Inbox> inbox_, tls_inbox_;
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

// The receiver's identity for --tls, from the files the sending process wrote into `dir`.
absl::Status LoadReceiverIdentity(const std::string& dir) {
  absl::StatusOr<std::string> ca = common::ReadFile(dir + "/ca.crt");
  absl::StatusOr<std::string> cert = common::ReadFile(dir + "/receiver.crt");
  absl::StatusOr<std::string> key = common::ReadFile(dir + "/receiver.key");
  if (!ca.ok() || !cert.ok() || !key.ok()) return absl::NotFoundError(absl::StrCat("no TLS identity in ", dir));
  security::SetDataPlaneIdentity(*ca, {*key, *cert});
  return absl::OkStatus();
}

int Serve(const std::string& tls_dir) {
  Router router;
  worker::StageLinkService svc(&router);
  grpc::ServerBuilder b;
  int gport = 0, tls_port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &gport);
  if (!tls_dir.empty()) {
    if (!LoadReceiverIdentity(tls_dir).ok()) return 1;
    b.AddListeningPort("127.0.0.1:0", security::DataPlaneServerCredentials(), &tls_port);
  }
  ConfigureLonghaulServer(&b);
  b.RegisterCallbackGenericService(&svc);
  auto server = b.BuildAndStart();

  // The benchmark's own sink on loopback: as many bytes as the run sends.
  absl::StatusOr<netem::TcpSink> sink = netem::TcpSink::Listen("127.0.0.1", 0, std::numeric_limits<int64_t>::max());
  if (!sink.ok()) return 1;
  std::printf("%d %d %d\n", gport, tls_port, sink->port());
  std::fflush(stdout);
  std::thread([s = std::move(*sink)]() mutable { s.Serve(); }).detach();
  for (const std::shared_ptr<worker::Inbox>& inbox : {router.inbox_, router.tls_inbox_}) {
    std::thread([inbox] {
      for (;;) {
        auto f = inbox->Pop(absl::Hours(1));
        if (!f.ok()) return;
      }
    }).detach();
  }
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
  bool json = false, serve = false, tls = false;
  std::string tls_dir;  // --serve: the receiver's identity (written by the sending process)
};

// A CA and the two ends' worker identities in a new temporary directory (removed by the caller).
absl::StatusOr<std::string> MakeTlsFiles(security::KeyAndCert* sender, std::string* ca_pem) {
  absl::StatusOr<security::CertificateAuthority> ca = security::CertificateAuthority::Create("bench CA");
  if (!ca.ok()) return ca.status();
  std::string tmpl = "/tmp/longhaul-bench-tls-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::vector<std::string> dns = {security::kWorkerServerName};
  absl::StatusOr<security::KeyAndCert> recv = ca->Issue({"receiver", security::Role::kWorker}, absl::Hours(1), dns);
  absl::StatusOr<security::KeyAndCert> send = ca->Issue({"sender", security::Role::kWorker}, absl::Hours(1), dns);
  if (!recv.ok() || !send.ok()) return absl::InternalError("cannot issue the benchmark's certificates");
  using File = std::pair<const char*, const std::string*>;
  for (auto [file, text] : {File{"/ca.crt", &ca->cert_pem()}, File{"/receiver.crt", &recv->cert_pem},
                            File{"/receiver.key", &recv->key_pem}}) {
    if (absl::Status st = security::WriteFileAtomic(tmpl + file, *text, 0600); !st.ok()) return st;
  }
  *sender = *send;
  *ca_pem = ca->cert_pem();
  return tmpl;
}

// One timed gRPC run: every frame of `t` to 127.0.0.1:port over the data plane's channels.
struct GrpcRun {
  absl::Status status;
  double seconds = 0, cpu = 0;
  int64_t wire = 0;
  int streams = 0;
  std::string codec;
};
GrpcRun RunGrpc(const Flags& f, int port, uint64_t job_id, const torch::Tensor& t, int64_t frames, pid_t child) {
  GrpcRun r;
  auto codec = codec::MakeCodec(f.codec);
  worker::SenderOptions o;
  o.target = absl::StrCat("127.0.0.1:", port);
  o.peer = "bench receiver";
  o.job_id = job_id;
  o.queue_capacity = 4;
  o.streams = static_cast<int>(f.streams);
  auto sender = worker::LinkSender::Start(o, codec->get());
  if (!sender.ok()) {
    r.status = sender.status();
    return r;
  }
  const double c0 = CpuSeconds(child);
  const auto g0 = Clock::now();
  for (int64_t i = 0; i < frames && r.status.ok(); ++i) {
    stage_runtime::LinkMessage m;
    m.step = 1;
    m.micro_batch = static_cast<int>(i);
    m.tensor = t;
    r.status = (*sender)->Send(std::move(m), false);
  }
  if (r.status.ok()) r.status = (*sender)->Finish();
  r.seconds = std::chrono::duration<double>(Clock::now() - g0).count();
  r.cpu = CpuSeconds(child) - c0;
  r.wire = (*sender)->stats().wire_bytes;
  r.streams = (*sender)->streams();
  r.codec = (*codec)->spec();
  return r;
}

int Run(const Flags& f, const CLI::App& cmd) {
  common::TuneAllocatorForLargeFrames();  // as longhaul-worker does
  if (f.serve) return Serve(f.tls_dir);
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
  std::string tls_dir, ca_pem;
  security::KeyAndCert sender_identity;
  if (f.tls) {
    absl::StatusOr<std::string> dir = MakeTlsFiles(&sender_identity, &ca_pem);
    if (!dir.ok()) {
      std::fprintf(stderr, "longhaul-bench transport: %s\n", std::string(dir.status().message()).c_str());
      return 1;
    }
    tls_dir = *dir;
  }
  std::vector<std::string> child_args = {"transport", "--serve"};
  if (f.tls) child_args.push_back(absl::StrCat("--tls-dir=", tls_dir));
  bp::child child(bp::exe = "/proc/self/exe", bp::args = child_args, bp::std_in < child_in, bp::std_out > child_out, ec);
  if (ec) {
    std::fprintf(stderr, "longhaul-bench transport: cannot start the receiver process: %s\n", ec.message().c_str());
    return 1;
  }
  int gport = 0, tls_port = 0, tport = 0;
  if (!(child_out >> gport >> tls_port >> tport) || (f.tls && tls_port == 0)) {
    std::fprintf(stderr, "longhaul-bench transport: the receiver process did not start\n");
    return 1;
  }

  const int64_t elems = f.frame_bytes / 4;
  const int64_t frames = (f.bytes + f.frame_bytes - 1) / f.frame_bytes;
  torch::Tensor t = torch::randn({elems});
  const GrpcRun plain = RunGrpc(f, gport, 1, t, frames, child.id());
  if (!plain.status.ok()) {
    std::fprintf(stderr, "longhaul-bench transport: gRPC run failed: %s\n", std::string(plain.status.message()).c_str());
    return 1;
  }
  const double grpc_s = plain.seconds;
  const int64_t grpc_bytes = frames * elems * 4;
  const int64_t wire = plain.wire;
  GrpcRun tls;
  if (f.tls) {
    // From here on the data plane's channels present the sender's certificate (mutual TLS).
    security::SetDataPlaneIdentity(ca_pem, sender_identity);
    tls = RunGrpc(f, tls_port, 2, t, frames, child.id());
    (void)common::RemoveTree(tls_dir);
    if (!tls.status.ok()) {
      std::fprintf(stderr, "longhaul-bench transport: TLS run failed: %s\n", std::string(tls.status.message()).c_str());
      return 1;
    }
  }
  const double c1 = CpuSeconds(child.id());
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
  const double grpc_cpu = plain.cpu / gib, tcp_cpu = (c2 - c1) / gib;
  const double tls_gbps = f.tls ? grpc_bytes * 8 / tls.seconds / 1e9 : 0, tls_cpu = tls.cpu / gib;
  if (json) {
    const nlohmann::ordered_json out = {
        {"bytes", grpc_bytes},
        {"frame_bytes", elems * 4},
        {"codec", plain.codec},
        {"streams", plain.streams},
        {"wire_bytes", wire},
        {"grpc_gbps", Round(grpc_gbps, 4)},
        {"tcp_gbps", Round(tcp_gbps, 4)},
        {"ratio", Round(grpc_gbps / tcp_gbps, 4)},
        {"grpc_seconds", Round(grpc_s, 4)},
        {"tcp_seconds", Round(tcp_s, 4)},
        {"grpc_cpu_s_per_gib", Round(grpc_cpu, 3)},
        {"tcp_cpu_s_per_gib", Round(tcp_cpu, 3)},
    };
    nlohmann::ordered_json all = out;
    if (f.tls) {
      all["tls_gbps"] = Round(tls_gbps, 4);
      all["tls_seconds"] = Round(tls.seconds, 4);
      all["tls_cpu_s_per_gib"] = Round(tls_cpu, 3);
      all["tls_over_plaintext"] = Round(tls_gbps / grpc_gbps, 4);
    }
    std::printf("%s\n", all.dump().c_str());
  } else {
    std::printf("payload %.2f GiB in frames of %.1f MiB (%s), %d gRPC stream(s)\n", grpc_bytes / 1073741824.0,
                elems * 4 / 1048576.0, plain.codec.c_str(), plain.streams);
    std::printf("  gRPC data plane: %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB)\n", grpc_gbps, grpc_s, grpc_cpu);
    if (f.tls) {
      std::printf("  gRPC over mTLS:  %8.3f Gbit/s  (%.2f s, %.2f CPU s per GiB; %.3f of plaintext gRPC)\n", tls_gbps,
                  tls.seconds, tls_cpu, tls_gbps / grpc_gbps);
    }
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
  cmd->add_flag("--tls", f->tls,
                "also stream the same bytes over mutual TLS (the workers' credentials, a throwaway CA), in the same run");
  cmd->add_option("--tls-dir", f->tls_dir, "internal: the receiving process's TLS identity")->type_name("DIR");
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
      "grpc_seconds, tcp_seconds, grpc_cpu_s_per_gib, tcp_cpu_s_per_gib; with --tls also tls_gbps,\n"
      "tls_seconds, tls_cpu_s_per_gib and tls_over_plaintext (TLS goodput / plaintext gRPC goodput).");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
