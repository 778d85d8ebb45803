// longhaul-coordinator: the control-plane daemon (worker registry, jobs, placement, state file).
#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/store.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/signals.h"
#include "proto/channel_config.h"

int main(int argc, char** argv) {
  using namespace longhaul::coordinator;
  std::string listen = "0.0.0.0:7400", state = "longhaul-coordinator.db", port_file;
  int64_t timeout_ms = 10000, interval_ms = 1000;
  CLI::App app{
      "Keeps the worker registry (heartbeats), accepts jobs from longhaulctl, places their stages on\n"
      "idle workers and follows their progress. Everything is recorded in a SQLite state file, so a\n"
      "restarted coordinator still knows every job. Runs until SIGTERM or SIGINT.",
      "longhaul-coordinator"};
  app.option_defaults()->always_capture_default();
  app.add_option("--listen", listen, "control-plane address (port 0 picks a free one)")->type_name("HOST:PORT");
  app.add_option("--state", state, "SQLite state file")->type_name("PATH");
  app.add_option("--port-file", port_file, "write the bound port here once listening (for scripts and tests)")
      ->type_name("PATH");
  app.add_option("--heartbeat-timeout-ms", timeout_ms, "declare a worker dead after N ms without a heartbeat")
      ->type_name("N");
  app.add_option("--heartbeat-interval-ms", interval_ms, "how often workers send heartbeats (at least 10 ms)")
      ->type_name("N");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  if (interval_ms < 10 || timeout_ms <= interval_ms) {
    return longhaul::common::FlagError(app, "need 10 <= --heartbeat-interval-ms < --heartbeat-timeout-ms");
  }
  if (!longhaul::common::InstallTerminationHandlers()) {
    std::fprintf(stderr, "longhaul-coordinator: cannot install signal handlers\n");
    return 1;
  }

  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(state);
  if (!store.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  CoordinatorOptions o;
  o.heartbeat_timeout = absl::Milliseconds(timeout_ms);
  o.heartbeat_interval = absl::Milliseconds(interval_ms);
  absl::StatusOr<std::unique_ptr<CoordinatorService>> svc = CoordinatorService::Create(std::move(*store), o);
  if (!svc.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(svc.status().message()).c_str());
    return 1;
  }
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
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());  // atomic: readers never see a partial number
  }
  longhaul::common::Log("coordinator", absl::StrCat("listening on port ", port, ", state file ", state));
  (*svc)->StartMonitor();
  const int sig = longhaul::common::WaitForTerminationSignal();
  longhaul::common::Log("coordinator", absl::StrCat(longhaul::common::SignalName(sig), ": shutting down"));
  (*svc)->Stop();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  return 0;
}
