// longhaul-coordinator: the control-plane daemon (worker registry, jobs, placement, state file).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/store.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/signals.h"
#include "proto/channel_config.h"
#include "security/pki.h"
#include "security/tls.h"

namespace {

// "300ms", "1.5s", "10m" (absl::ParseDuration), or a plain number of seconds.
bool ParseDurationFlag(const std::string& text, absl::Duration* d) {
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    *d = absl::Seconds(seconds);
    return true;
  }
  return absl::ParseDuration(text, d);
}

void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());  // atomic: readers never see a partial number
}

}  // namespace

int main(int argc, char** argv) {
  using namespace longhaul::coordinator;
  std::string listen = "0.0.0.0:7400", state = "longhaul-coordinator.db", port_file;
  std::string interval_flag = "1s", timeout_flag = "3s", reserve_flag = "10m", reattach_flag = "30s";
  std::string metrics_listen = "0.0.0.0:9464", metrics_port_file;
  std::string pki_dir;
  bool insecure = false;
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
  app.add_option("--heartbeat-interval", interval_flag,
                 "how often workers send a heartbeat (told to them when they register; at least 100ms)")
      ->type_name("DURATION");
  app.add_option("--heartbeat-timeout", timeout_flag,
                 "declare a worker dead, and recover its job, after this long without a heartbeat (more than the "
                 "interval)")
      ->type_name("DURATION");
  app.add_option("--reserve-after", reserve_flag,
                 "a pending job that has waited this long holds back the jobs submitted after it until it starts "
                 "(so small jobs cannot starve a big one)")
      ->type_name("DURATION");
  app.add_option("--reattach-grace", reattach_flag,
                 "after a restart, how long the workers of running jobs have to register again before their "
                 "stages are recovered on other workers (docs/recovery.md)")
      ->type_name("DURATION");
  app.add_option("--metrics-listen", metrics_listen,
                 "Prometheus endpoint: /metrics, and /sd (the workers' endpoints for http_sd_configs); "
                 "none: off. Port 0 picks a free one; a port that is taken is an error (Prometheus's "
                 "configuration names it)")
      ->type_name("HOST:PORT|none");
  app.add_option("--metrics-port-file", metrics_port_file, "write the metrics server's port here once listening")
      ->type_name("PATH");
  app.add_option("--pki-dir", pki_dir,
                 "the cluster's CA and this coordinator's certificates, made on first start (ca.key and the other "
                 "keys mode 0600); admin.key/admin.crt there are longhaulctl's admin identity (docs/security.md). "
                 "Default: longhaul-pki next to the --state file")
      ->type_name("DIR");
  app.add_flag("--insecure", insecure,
               "plaintext gRPC without identities: every caller may do everything. Refused unless --listen is a "
               "loopback address");
  app.footer(
      "A DURATION is a number of seconds or a number with a unit: 300ms, 1.5s, 10m, 1h.\n"
      "TLS (the default): workers join with a token from `longhaulctl token create` and the CA fingerprint\n"
      "printed at start-up; docs/security.md.");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  absl::Duration interval, timeout, reserve_after, reattach_grace;
  for (auto [flag, text, d] : {std::tuple{"--heartbeat-interval", &interval_flag, &interval},
                               std::tuple{"--heartbeat-timeout", &timeout_flag, &timeout},
                               std::tuple{"--reserve-after", &reserve_flag, &reserve_after},
                               std::tuple{"--reattach-grace", &reattach_flag, &reattach_grace}}) {
    if (!ParseDurationFlag(*text, d) || *d < absl::ZeroDuration()) {
      return longhaul::common::FlagError(app, absl::StrCat(flag, ": \"", *text, "\" is not a duration (e.g. 1s)"));
    }
  }
  // Workers send no more often than every 100 ms (worker/worker.cc).
  if (interval < absl::Milliseconds(100)) return longhaul::common::FlagError(app, "--heartbeat-interval must be at least 100ms");
  if (timeout <= interval) {
    return longhaul::common::FlagError(
        app, absl::StrCat("--heartbeat-timeout (", absl::FormatDuration(timeout), ") must be longer than --heartbeat-interval (",
                          absl::FormatDuration(interval), ")"));
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
  // After the state file's lock: a second coordinator on the same state never touches the CA.
  std::optional<longhaul::security::ClusterPki> pki;
  if (insecure) {
    if (absl::Status s = longhaul::security::CheckLoopbackListen("--listen", listen); !s.ok()) {
      std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  } else {
    if (pki_dir.empty()) {
      const size_t slash = state.rfind('/');
      pki_dir = slash == std::string::npos ? "longhaul-pki" : absl::StrCat(state.substr(0, slash + 1), "longhaul-pki");
    }
    absl::StatusOr<longhaul::security::ClusterPki> opened = longhaul::security::OpenClusterPki(pki_dir);
    if (!opened.ok()) {
      std::fprintf(stderr, "longhaul-coordinator: --pki-dir %s: %s\n", pki_dir.c_str(),
                   std::string(opened.status().message()).c_str());
      return 1;
    }
    pki = *std::move(opened);
    longhaul::common::Log("coordinator", absl::StrCat(pki->created ? "created the cluster CA in " : "cluster CA in ",
                                                      pki_dir, "; CA fingerprint ", pki->ca.fingerprint()));
  }
  CoordinatorOptions o;
  if (pki) o.ca = &pki->ca;
  o.heartbeat_timeout = timeout;
  o.heartbeat_interval = interval;
  o.queue.reserve_after = reserve_after;
  o.reattach_grace = reattach_grace;
  // A cancelled stage stops at its next wait; allow a hung one as long as a heartbeat timeout
  // thrice, at least 30 s (a step of a big model, a checkpoint being written).
  o.stop_timeout = std::max(absl::Seconds(30), 3 * timeout);
  absl::StatusOr<std::unique_ptr<CoordinatorService>> svc = CoordinatorService::Create(std::move(*store), o);
  if (!svc.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: %s\n", std::string(svc.status().message()).c_str());
    return 1;
  }
  // Declared before the server, so the server (whose handlers use it) is destroyed first.
  std::unique_ptr<CoordinatorMetrics> exported;
  std::string metrics_note;
  absl::StatusOr<std::unique_ptr<longhaul::common::MetricsServer>> metrics =
      longhaul::common::StartMetricsServer(metrics_listen, /*fallback_to_free_port=*/false, &metrics_note);
  if (!metrics.ok()) {
    std::fprintf(stderr, "longhaul-coordinator: --metrics-listen: %s\n", std::string(metrics.status().message()).c_str());
    return 1;
  }
  if (!metrics_note.empty()) longhaul::common::Log("coordinator", metrics_note);
  if (*metrics) {
    exported = std::make_unique<CoordinatorMetrics>(*longhaul::common::MetricsRegistry(), svc->get());
    (*metrics)->OnScrape([m = exported.get()] { m->Refresh(); });
    (*metrics)->Serve("/sd", "application/json", [m = exported.get()] { return m->DiscoveryJson(); });
    longhaul::common::Log("coordinator", absl::StrCat("metrics on port ", (*metrics)->port(), " (/metrics, /sd)"));
    if (!metrics_port_file.empty()) WritePortFile(metrics_port_file, (*metrics)->port());
  }
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen,
                     pki ? longhaul::security::ServerCredentials(pki->server, pki->ca.cert_pem(),
                                                                 longhaul::security::ClientCerts::kOptional)
                         : grpc::InsecureServerCredentials(),
                     &port);
  longhaul::ConfigureLonghaulServer(&b);
  b.RegisterService(svc->get());
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "longhaul-coordinator: cannot listen on %s (address in use or invalid?)\n", listen.c_str());
    return 1;
  }
  if (!port_file.empty()) WritePortFile(port_file, port);
  longhaul::common::Log("coordinator", absl::StrCat("listening on port ", port, pki ? " (TLS)" : " (plaintext, --insecure)",
                                                    ", state file ", state, ", heartbeat every ",
                                                    absl::FormatDuration(interval), ", timeout ",
                                                    absl::FormatDuration(timeout)));
  (*svc)->StartMonitor();
  const int sig = longhaul::common::WaitForTerminationSignal();
  longhaul::common::Log("coordinator", absl::StrCat(longhaul::common::SignalName(sig), ": shutting down"));
  (*svc)->Stop();
  metrics->reset();  // no scrape reads the service after this
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  return 0;
}
