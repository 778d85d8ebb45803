// longhaul-netem: builds emulated slow networks from network namespaces + veth + a bridge + tc, runs
// commands inside them, and measures a link. See netem/tc/network.h for the topology file.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/read_file.h"
#include "common/signals.h"
#include "netem/tc/claim.h"
#include "netem/tc/network.h"
#include "netem/tcp_probe.h"

namespace {

int Fail(const std::string& m, int code = 1) {
  std::fprintf(stderr, "longhaul-netem: %s\n", m.c_str());
  return code;
}

absl::StatusOr<longhaul::netem::Topology> Load(const std::string& path) {
  absl::StatusOr<std::string> yaml = longhaul::common::ReadFile(path);
  if (!yaml.ok()) return yaml.status();
  auto t = longhaul::netem::ParseTopology(*yaml);
  if (!t.ok()) return absl::InvalidArgumentError(path + ":\n" + std::string(t.status().message()));
  return t;
}

int Sink(int port) {
  // A measurement tool run by hand: any probe size the source asks for.
  absl::StatusOr<longhaul::netem::TcpSink> sink =
      longhaul::netem::TcpSink::Listen("0.0.0.0", port, std::numeric_limits<int64_t>::max());
  if (!sink.ok()) return Fail("sink: " + std::string(sink.status().message()));
  std::fprintf(stderr, "sink listening on port %d\n", sink->port());
  sink->Serve();
  return 1;
}

int Source(const std::string& host, int port, int64_t bytes, double pace_mbit) {
  // The sink may still be starting: retry the connection for up to 5 s.
  absl::StatusOr<double> s = longhaul::netem::TimedTcpSend(host, port, bytes, absl::Seconds(5), "", pace_mbit);
  if (!s.ok()) return Fail("source: " + std::string(s.status().message()));
  // Rounded: more digits would be noise.
  const nlohmann::ordered_json out = {{"bytes", bytes},
                                      {"seconds", std::round(*s * 1e4) / 1e4},
                                      {"mbit_per_s", std::round(bytes * 8 / *s / 1e3) / 1e3}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Builds emulated slow networks from network namespaces + veth + a bridge + tc, runs commands\n"
      "inside them, and measures a link.",
      "longhaul-netem"};
  app.require_subcommand(1);
  std::string topology, host, to;
  std::vector<std::string> command;
  int port = 0;
  int64_t bytes = 0;
  double pace_mbit = 0;
  auto add_topology = [&topology](CLI::App* c) {
    c->add_option("topology", topology, "the topology file")->type_name("TOPOLOGY.yaml")->required();
    return c;
  };
  CLI::App* up = add_topology(app.add_subcommand(
      "up", "create the namespaces, veths, bridge and tc qdiscs (root only); on failure or Ctrl-C\n"
            "everything built so far is removed"));
  CLI::App* down = add_topology(app.add_subcommand("down", "remove them (root only; idempotent)"));
  CLI::App* hosts = add_topology(app.add_subcommand("hosts", "list hosts, namespaces and addresses"));
  CLI::App* exec = add_topology(app.add_subcommand(
      "exec", "run a command inside HOST's namespace: exec TOPOLOGY.yaml HOST -- COMMAND [ARGS...]\n"
              "(e.g. a worker with --listen=<its address>:7500 --coordinator=<address>:7400)"));
  exec->add_option("host", host, "a host of the topology")->type_name("HOST")->required();
  exec->add_option("command", command, "the command and its arguments, after --")->type_name("COMMAND")->required();
  CLI::App* sink = app.add_subcommand("sink", "accept TCP connections, count bytes, answer the count");
  sink->add_option("--port", port, "TCP port to listen on")->type_name("P")->required();
  CLI::App* source = app.add_subcommand(
      "source", "send N bytes to a sink, print the goodput in Mbit/s (JSON: bytes, seconds, mbit_per_s)");
  source->add_option("--to", to, "the sink")->type_name("HOST:PORT")->required();
  source->add_option("--bytes", bytes, "bytes to send")->type_name("N")->required();
  source->add_option("--pace-mbit", pace_mbit,
                     "the kernel paces the connection at this rate of TCP payload (SO_MAX_PACING_RATE); 0: unpaced")
      ->type_name("MBIT");
  // After the subcommands: their help shows their own flags only.
  app.footer(
      "Topology file: netem/tc/network.h (hosts with rate_mbit, delay_ms, jitter_ms, loss, queue_ms:\n"
      "the tbf queue in ms of traffic, default 400, beyond which packets are dropped). tc netem\n"
      "(delay/loss) is used when the kernel has it; `up` says when it does not, and then delay, jitter\n"
      "and loss belong in the job spec's links: section (in-process shaper). Every host namespace uses\n"
      "the topology's tcp_congestion (default cubic; host: this machine's), whatever the machine's is.");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;

  if (sink->parsed()) return Sink(port);
  if (source->parsed()) {
    const std::vector<std::string> hp = absl::StrSplit(to, ':');
    int to_port;
    if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &to_port)) {
      return longhaul::common::FlagError(app, "--to needs HOST:PORT");
    }
    if (bytes <= 0) return longhaul::common::FlagError(app, "--bytes needs a positive integer");
    return Source(hp[0], to_port, bytes, pace_mbit);
  }
  absl::StatusOr<longhaul::netem::Topology> t = Load(topology);
  if (!t.ok()) return Fail(std::string(t.status().message()), 2);
  if (hosts->parsed()) {
    for (const auto& h : t->hosts) {
      std::printf("%-8s namespace %-14s address %-15s rate %g Mbit/s delay %g ms jitter %g ms loss %g queue %g ms\n",
                  h.name.c_str(), t->Namespace(h.name).c_str(), t->Address(h.name).c_str(), h.rate_mbit, h.delay_ms,
                  h.jitter_ms, h.loss, h.queue_ms);
    }
    return 0;
  }
  if (exec->parsed()) {
    if (t->Address(host).empty()) return Fail("no host \"" + host + "\" in " + topology, 2);
    // Not a child process: `ip netns exec` replaces this one, so the command's exit status, signals
    // and terminal are the caller's.
    std::vector<std::string> args = {"ip", "netns", "exec", t->Namespace(host)};
    args.insert(args.end(), command.begin(), command.end());
    std::vector<char*> cargs;
    for (std::string& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execvp("ip", cargs.data());
    return Fail("cannot run ip: " + std::string(std::strerror(errno)));
  }
  const std::string cmd = up->parsed() ? "up" : "down";
  if (geteuid() != 0) return Fail(cmd + " needs root (network namespaces and tc); run it with sudo", 1);
  // Held while this command runs: a sweep or test running on a network of this name built it for
  // itself and removes it when it ends (netem/tc/claim.h).
  absl::StatusOr<longhaul::netem::NetworkClaim> claim =
      longhaul::netem::NetworkClaim::Acquire(t->name, absl::ZeroDuration());
  if (!claim.ok()) return Fail(std::string(claim.status().message()));
  longhaul::netem::Network net(*t, longhaul::netem::RunCommand);
  if (down->parsed()) {
    absl::Status s = net.Down();
    if (!s.ok()) return Fail(std::string(s.message()));
    std::printf("removed %s\n", t->name.c_str());
    return 0;
  }
  // Ctrl-C / SIGTERM during `up`: stop between steps and roll back.
  longhaul::common::InstallTerminationHandlers();
  static std::atomic<bool> stop{false};
  std::thread([] {
    longhaul::common::WaitForTerminationSignal();
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
