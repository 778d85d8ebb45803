// longhaul-netem: builds emulated slow networks from network namespaces + veth + a bridge + tc, runs
// commands inside them, and measures a link. See netem/tc/network.h for the topology file.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "netem/tc/network.h"
#include "netem/tcp_probe.h"
#include "tools/cli/read_file.h"
#include "tools/cli/signals.h"

namespace {

constexpr char kUsage[] =
    "usage: longhaul-netem <command> ...\n"
    "\n"
    "  up TOPOLOGY.yaml             create the namespaces, veths, bridge and tc qdiscs (root only);\n"
    "                               on failure or Ctrl-C everything built so far is removed\n"
    "  down TOPOLOGY.yaml           remove them (idempotent)\n"
    "  exec TOPOLOGY.yaml HOST -- COMMAND [ARGS...]\n"
    "                               run a command inside HOST's namespace (e.g. a worker with\n"
    "                               --listen=<its address>:7500 --coordinator=<address>:7400)\n"
    "  hosts TOPOLOGY.yaml          list hosts, namespaces and addresses\n"
    "  sink --port=P                accept TCP connections, count bytes, answer the count\n"
    "  source --to=HOST:PORT --bytes=N\n"
    "                               send N bytes to a sink, print the goodput in Mbit/s\n"
    "\n"
    "Topology file: netem/tc/network.h (hosts with rate_mbit, delay_ms, jitter_ms, loss, queue_ms:\n"
    "the tbf queue in ms of traffic, default 400, beyond which packets are dropped). tc netem\n"
    "(delay/loss) is used when the kernel has it; `up` says when it does not, and then delay, jitter\n"
    "and loss belong in the job spec's links: section (in-process shaper).\n";

int Fail(const std::string& m, int code = 1) {
  std::fprintf(stderr, "longhaul-netem: %s\n", m.c_str());
  return code;
}

absl::StatusOr<longhaul::netem::Topology> Load(const std::string& path) {
  absl::StatusOr<std::string> yaml = longhaul::cli::ReadFile(path);
  if (!yaml.ok()) return yaml.status();
  auto t = longhaul::netem::ParseTopology(*yaml);
  if (!t.ok()) return absl::InvalidArgumentError(path + ":\n" + std::string(t.status().message()));
  return t;
}

bool FlagValue(const std::string& arg, const std::string& name, std::string* v) {
  const std::string p = "--" + name + "=";
  if (arg.rfind(p, 0) != 0) return false;
  *v = arg.substr(p.size());
  return true;
}

int Sink(int port) {
  absl::StatusOr<longhaul::netem::TcpSink> sink = longhaul::netem::TcpSink::Listen("0.0.0.0", port);
  if (!sink.ok()) return Fail("sink: " + std::string(sink.status().message()));
  std::fprintf(stderr, "sink listening on port %d\n", sink->port());
  sink->Serve();
  return 1;
}

int Source(const std::string& to, int64_t bytes) {
  std::vector<std::string> hp = absl::StrSplit(to, ':');
  int port;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) return Fail("source: --to needs HOST:PORT", 2);
  // The sink may still be starting: retry the connection for up to 5 s.
  absl::StatusOr<double> s = longhaul::netem::TimedTcpSend(hp[0], port, bytes, absl::Seconds(5));
  if (!s.ok()) return Fail("source: " + std::string(s.status().message()));
  std::printf("{\"bytes\": %lld, \"seconds\": %.4f, \"mbit_per_s\": %.3f}\n", static_cast<long long>(bytes), *s,
              bytes * 8 / *s / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty() || a[0] == "--help" || a[0] == "-h" || a[0] == "help") {
    std::fputs(kUsage, a.empty() ? stderr : stdout);
    return a.empty() ? 2 : 0;
  }
  const std::string cmd = a[0];
  if (cmd == "sink") {
    std::string v;
    int port = 0;
    if (a.size() != 2 || !FlagValue(a[1], "port", &v) || !absl::SimpleAtoi(v, &port)) return Fail("usage: sink --port=P", 2);
    return Sink(port);
  }
  if (cmd == "source") {
    std::string to, b;
    int64_t bytes = 0;
    for (size_t i = 1; i < a.size(); ++i) {
      if (!FlagValue(a[i], "to", &to) && !FlagValue(a[i], "bytes", &b)) return Fail("unknown argument " + a[i], 2);
    }
    if (to.empty() || !absl::SimpleAtoi(b, &bytes) || bytes <= 0) return Fail("usage: source --to=HOST:PORT --bytes=N", 2);
    return Source(to, bytes);
  }
  if (a.size() < 2) return Fail("usage: " + cmd + " TOPOLOGY.yaml ...", 2);
  absl::StatusOr<longhaul::netem::Topology> t = Load(a[1]);
  if (!t.ok()) return Fail(std::string(t.status().message()), 2);
  if (cmd == "hosts") {
    for (const auto& h : t->hosts) {
      std::printf("%-8s namespace %-14s address %-15s rate %g Mbit/s delay %g ms jitter %g ms loss %g queue %g ms\n",
                  h.name.c_str(), t->Namespace(h.name).c_str(), t->Address(h.name).c_str(), h.rate_mbit, h.delay_ms,
                  h.jitter_ms, h.loss, h.queue_ms);
    }
    return 0;
  }
  if (cmd == "exec") {
    if (a.size() < 5 || a[3] != "--") return Fail("usage: exec TOPOLOGY.yaml HOST -- COMMAND [ARGS...]", 2);
    if (t->Address(a[2]).empty()) return Fail("no host \"" + a[2] + "\" in " + a[1], 2);
    std::vector<std::string> args = {"ip", "netns", "exec", t->Namespace(a[2])};
    args.insert(args.end(), a.begin() + 4, a.end());
    std::vector<char*> cargs;
    for (std::string& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execvp("ip", cargs.data());
    return Fail("cannot run ip: " + std::string(std::strerror(errno)));
  }
  if (cmd != "up" && cmd != "down") return Fail("unknown command \"" + cmd + "\"\n\n" + kUsage, 2);
  if (geteuid() != 0) return Fail(cmd + " needs root (network namespaces and tc); run it with sudo", 1);
  longhaul::netem::Network net(*t, longhaul::netem::RunCommand);
  if (cmd == "down") {
    absl::Status s = net.Down();
    if (!s.ok()) return Fail(std::string(s.message()));
    std::printf("removed %s\n", t->name.c_str());
    return 0;
  }
  // Ctrl-C / SIGTERM during `up`: stop between steps and roll back.
  longhaul::cli::InstallTerminationHandlers();
  static std::atomic<bool> stop{false};
  std::thread([] {
    longhaul::cli::WaitForTerminationSignal();
    stop = true;
  }).detach();
  absl::Status s = net.Up([] { return stop.load(); });
  for (const std::string& n : net.notes()) std::fprintf(stderr, "note: %s\n", n.c_str());
  if (!s.ok()) return Fail(std::string(s.message()));
  for (const auto& h : t->hosts) {
    std::printf("%s: namespace %s, address %s\n", h.name.c_str(), t->Namespace(h.name).c_str(), t->Address(h.name).c_str());
  }
  return 0;
}
