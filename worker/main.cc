// longhaul-worker: the worker daemon. Hosts a pipeline stage when the coordinator assigns one.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/signals.h"
#include "stage_runtime/compute_threads.h"
#include "stage_runtime/executor.h"
#include "security/tls.h"
#include "worker/identity.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  longhaul::common::InstallCrashHandler(argv[0]);
  longhaul::worker::WorkerOptions o;
  int64_t threads = 0;
  CLI::App app{
      "Registers with the coordinator, then trains the pipeline stage it is assigned, streaming\n"
      "compressed activations and gradients to its neighbour stages over gRPC. Runs until SIGTERM or\n"
      "SIGINT, which stop the running job (reported as failed) and exit cleanly.",
      "longhaul-worker"};
  app.option_defaults()->always_capture_default();
  app.add_option("--coordinator", o.coordinator, "coordinator address")->type_name("HOST:PORT");
  app.add_option("--listen", o.listen, "data-plane listen address (port 0: a free port)")->type_name("HOST:PORT");
  app.add_option("--advertise-host", o.advertise_host,
                 "host neighbours use to reach this worker (empty: the listen host, 127.0.0.1 when\n"
                 "listening on 0.0.0.0)")
      ->type_name("HOST");
  app.add_option("--name", o.name, "worker name, unique among live workers (empty: HOSTNAME-PORT)")
      ->type_name("NAME");
  app.add_option("--region", o.region,
                 "region label: placement, two-level data-parallel collectives, and links.between_regions_mbit "
                 "for links to other regions")
      ->type_name("NAME")
      ->capture_default_str();
  app.add_option("--device", o.device, "where the stage computes: cpu, cuda or cuda:N")->type_name("DEV");
  app.add_option("--data-dir", o.data_dir, "checkpoints and job files")->type_name("DIR");
  app.add_option("--allow-paths", o.allow_paths,
                 "directories besides --data-dir that a job spec's checkpoint.dir and data.corpus may\n"
                 "name (comma-separated or repeated); any other path from a spec is refused")
      ->type_name("DIR[,DIR...]")
      ->delimiter(',');
  app.add_option("--threads", threads, "CPU compute threads: LibTorch's intra-op pool and OpenBLAS's (0: all cores)")->type_name("N");
  double replica_gib = static_cast<double>(o.replica_max_bytes) / (int64_t{1} << 30);
  app.add_option("--replica-max-gib", replica_gib,
                 "largest stage checkpoint this worker keeps a copy of for another worker, or fetches to\n"
                 "restore a stage (docs/recovery.md)")
      ->type_name("GIB");
  o.metrics_listen = "0.0.0.0:9465";
  CLI::Option* metrics_flag =
      app.add_option("--metrics-listen", o.metrics_listen,
                     "Prometheus /metrics endpoint, reported to the coordinator for its service discovery;\n"
                     "none: off. Port 0 picks a free one; the default port, if taken (several workers on\n"
                     "one host), falls back to a free one")
          ->type_name("HOST:PORT|none");
  // Link measurement for placement (worker/link_prober.h, docs/placement.md).
  app.add_option("--probe-listen", o.probe_listen,
                 "link probe sink the other workers measure their links to this one with (empty: the\n"
                 "--listen host, a free port); none: no sink and no probing")
      ->type_name("HOST:PORT|none");
  double probe_mib = static_cast<double>(o.probe.max_probe_bytes) / (1 << 20);
  double budget_mib = static_cast<double>(o.probe.budget_bytes_per_hour) / (1 << 20);
  std::string probe_interval = "10m";
  app.add_option("--probe-mib", probe_mib,
                 "most MiB one link probe sends (probes are sized to last ~0.5 s at the last measured\n"
                 "rate); this worker's sink refuses larger ones")
      ->type_name("MIB");
  app.add_option("--probe-budget-mib", budget_mib, "most MiB all link probes send per hour (0: no probing)")
      ->type_name("MIB");
  app.add_option("--probe-interval", probe_interval, "re-measure each link this often (e.g. 10m, 90s)")
      ->type_name("DURATION");
  // Identity (docs/security.md; worker/identity.h).
  bool insecure = false;
  std::string join_token, ca_fingerprint;
  app.add_option("--join-token", join_token,
                 "join the cluster with this token (longhaulctl token create): the coordinator signs a\n"
                 "certificate for this worker, kept in DATA_DIR/tls and used from then on (else $LONGHAUL_JOIN_TOKEN)")
      ->type_name("TOKEN")
      ->envname("LONGHAUL_JOIN_TOKEN");
  app.add_option("--ca-fingerprint", ca_fingerprint,
                 "the cluster CA's fingerprint the coordinator printed at start-up; the coordinator is\n"
                 "trusted only if its CA has it (else $LONGHAUL_CA_FINGERPRINT)")
      ->type_name("sha256:HEX")
      ->envname("LONGHAUL_CA_FINGERPRINT");
  app.add_flag("--insecure", insecure,
               "plaintext gRPC without identities (a coordinator started with --insecure); refused\n"
               "unless --listen is a loopback address");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  o.metrics_fallback = metrics_flag->count() == 0;
  if (!(probe_mib > 0) || probe_mib > 1024) return longhaul::common::FlagError(app, "--probe-mib must be in (0, 1024]");
  if (!(budget_mib >= 0)) return longhaul::common::FlagError(app, "--probe-budget-mib must not be negative");
  o.probe.max_probe_bytes = static_cast<int64_t>(probe_mib * (1 << 20));
  o.probe.min_probe_bytes = std::min(o.probe.min_probe_bytes, o.probe.max_probe_bytes);
  o.probe.budget_bytes_per_hour = static_cast<int64_t>(budget_mib * (1 << 20));
  double interval_s = 0;
  if (absl::SimpleAtod(probe_interval, &interval_s)) {
    o.probe.interval = absl::Seconds(interval_s);
  } else if (!absl::ParseDuration(probe_interval, &o.probe.interval)) {
    return longhaul::common::FlagError(app, "--probe-interval: \"" + probe_interval + "\" is not a duration (e.g. 10m)");
  }
  if (o.probe.interval < absl::Seconds(1)) return longhaul::common::FlagError(app, "--probe-interval must be at least 1s");
  if (absl::StatusOr<torch::Device> d = longhaul::stage_runtime::ParseDevice(o.device); !d.ok()) {
    return longhaul::common::FlagError(app, "--device=" + o.device + ": " + std::string(d.status().message()));
  }
  if (threads < 0) return longhaul::common::FlagError(app, "--threads needs a non-negative integer");
  if (!(replica_gib > 0)) return longhaul::common::FlagError(app, "--replica-max-gib must be positive");
  o.replica_max_bytes = static_cast<int64_t>(replica_gib * static_cast<double>(int64_t{1} << 30));
  longhaul::common::TuneAllocatorForLargeFrames();
  std::optional<longhaul::stage_runtime::ComputeThreads> compute;
  if (threads > 0) {
    compute = longhaul::stage_runtime::SetComputeThreads(static_cast<int>(threads));
    torch::set_num_interop_threads(1);
  }

  // TEST HOOK, for the integration tests of the progress watchdog (docs/recovery.md), read once
  // here: LONGHAUL_TEST_HANG_AT_STEP=N makes stage LONGHAUL_TEST_HANG_STAGE (default: any) of a
  // job's first attempt stop before its step N and stay stopped, ignoring cancellation, while the
  // worker keeps sending heartbeats. Never set it in production.
  if (const char* hang = std::getenv("LONGHAUL_TEST_HANG_AT_STEP"); hang != nullptr && *hang != '\0') {
    const char* stage = std::getenv("LONGHAUL_TEST_HANG_STAGE");
    if (!absl::SimpleAtoi(hang, &o.test_hang.at_step) || o.test_hang.at_step < 1 ||
        (stage != nullptr && *stage != '\0' && (!absl::SimpleAtoi(stage, &o.test_hang.stage) || o.test_hang.stage < 0))) {
      std::fprintf(stderr, "longhaul-worker: LONGHAUL_TEST_HANG_AT_STEP / _STAGE must be a step >= 1 / a stage >= 0\n");
      return 2;
    }
    std::fprintf(stderr, "longhaul-worker: TEST HOOK: stage %d of a job's first attempt hangs before step %lld\n",
                 o.test_hang.stage, static_cast<long long>(o.test_hang.at_step));
  }

  if (!longhaul::common::InstallTerminationHandlers()) {
    std::fprintf(stderr, "longhaul-worker: cannot install signal handlers\n");
    return 1;
  }

  if (insecure) {
    if (absl::Status s = longhaul::security::CheckLoopbackListen("--listen", o.listen); !s.ok()) {
      std::fprintf(stderr, "longhaul-worker: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    if (!longhaul::security::IsLoopbackTarget(o.coordinator)) {
      std::fprintf(stderr,
                   "longhaul-worker: --insecure talks plaintext, so only to a coordinator on this machine; "
                   "--coordinator=%s is not a loopback address (join with --join-token instead)\n",
                   o.coordinator.c_str());
      return 2;
    }
  } else {
    absl::StatusOr<longhaul::worker::WorkerIdentity> id = longhaul::worker::LoadOrJoin(
        {.data_dir = o.data_dir, .coordinator = o.coordinator, .name = o.name, .token = join_token,
         .ca_fingerprint = ca_fingerprint});
    if (!id.ok()) {
      std::fprintf(stderr, "longhaul-worker: %s\n", std::string(id.status().message()).c_str());
      return 1;
    }
    longhaul::common::Log(absl::StrCat("worker ", id->name),
                          id->joined ? absl::StrCat("joined the cluster; certificate in ", o.data_dir, "/tls")
                                     : absl::StrCat("identity from ", o.data_dir, "/tls"));
    o.name = id->name;
    o.tls.emplace(id->ca_pem, id->own);
  }
  absl::StatusOr<std::unique_ptr<longhaul::worker::Worker>> w = longhaul::worker::Worker::Start(o);
  if (!w.ok()) {
    std::fprintf(stderr, "longhaul-worker: %s\n", std::string(w.status().message()).c_str());
    return 1;
  }
  longhaul::worker::Worker* worker = w->get();
  if (compute) {
    longhaul::common::Log(absl::StrCat("worker ", worker->name()),
                          absl::StrCat("compute threads: ", compute->threads,
                                       compute->openblas ? " (LibTorch's and OpenBLAS's pools)" : " (LibTorch's pool)"));
  }
  std::thread signals([worker] {
    const int sig = longhaul::common::WaitForTerminationSignal();
    longhaul::common::Log(absl::StrCat("worker ", worker->name()),
                       absl::StrCat(longhaul::common::SignalName(sig), ": shutting down"));
    worker->Shutdown();
  });
  signals.detach();
  worker->Run();
  w->reset();
  return 0;
}
