// longhaul-coordinator: the control-plane daemon (worker registry, jobs, placement, state file).
#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/store.h"
#include "tools/cli/args.h"
#include "tools/cli/log.h"
#include "tools/cli/signals.h"
#include "proto/channel_config.h"

namespace {

constexpr char kUsage[] =
    "usage: longhaul-coordinator [--flags]\n"
    "\n"
    "Keeps the worker registry (heartbeats), accepts jobs from longhaulctl, places their stages on\n"
    "idle workers and follows their progress. Everything is recorded in a SQLite state file, so a\n"
    "restarted coordinator still knows every job. Runs until SIGTERM or SIGINT.\n"
    "\n"
    "flags:\n"
    "  --listen=HOST:PORT        control-plane address (default 0.0.0.0:7400; port 0 picks a free one)\n"
    "  --state=PATH              SQLite state file (default ./longhaul-coordinator.db)\n"
    "  --port-file=PATH          write the bound port here once listening (for scripts and tests)\n"
    "  --heartbeat-timeout-ms=N  declare a worker dead after N ms without a heartbeat (default 10000)\n"
    "  --heartbeat-interval-ms=N how often workers send heartbeats (default 1000)\n"
    "  --help                    this text\n";

}  // namespace

int main(int argc, char** argv) {
  using longhaul::cli::Args;
  using namespace longhaul::coordinator;
  absl::StatusOr<Args> args = Args::Parse(argc - 1, argv + 1,
                                          {"listen", "state", "port-file", "heartbeat-timeout-ms",
                                           "heartbeat-interval-ms", "help"});
  if (std::optional<int> rc = longhaul::cli::ExitForParseErrorOrHelp(args, "longhaul-coordinator", kUsage)) return *rc;
  absl::StatusOr<int64_t> timeout = args->Int("heartbeat-timeout-ms", 10000);
  absl::StatusOr<int64_t> interval = args->Int("heartbeat-interval-ms", 1000);
  if (!timeout.ok() || !interval.ok() || *interval < 10 || *timeout <= *interval) {
    std::fprintf(stderr, "longhaul-coordinator: need 10 <= --heartbeat-interval-ms < --heartbeat-timeout-ms\n");
    return 2;
  }
  if (!longhaul::cli::InstallTerminationHandlers()) {
    std::fprintf(stderr, "longhaul-coordinator: cannot install signal handlers\n");
    return 1;
  }

  const std::string state = args->Str("state", "longhaul-coordinator.db");
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(state);
  if (!store.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  CoordinatorOptions o;
  o.heartbeat_timeout = absl::Milliseconds(*timeout);
  o.heartbeat_interval = absl::Milliseconds(*interval);
  absl::StatusOr<std::unique_ptr<CoordinatorService>> svc = CoordinatorService::Create(std::move(*store), o);
  if (!svc.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(svc.status().message()).c_str());
    return 1;
  }
  const std::string listen = args->Str("listen", "0.0.0.0:7400");
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  longhaul::ConfigureLonghaulServer(&b);
  b.RegisterService(svc->get());
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "longhaul-coordinator: cannot listen on %s (address in use or invalid?)\n", listen.c_str());
    return 1;
  }
  if (args->Has("port-file")) {
    const std::string pf = args->Str("port-file", "");
    const std::string tmp = pf + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), pf.c_str());  // atomic: readers never see a partial number
  }
  longhaul::cli::Log("coordinator", absl::StrCat("listening on port ", port, ", state file ", state));
  (*svc)->StartMonitor();
  const int sig = longhaul::cli::WaitForTerminationSignal();
  longhaul::cli::Log("coordinator", absl::StrCat(longhaul::cli::SignalName(sig), ": shutting down"));
  (*svc)->Stop();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  return 0;
}
