// longhaul-worker: the worker daemon. Hosts a pipeline stage when the coordinator assigns one.
#include <cstdio>
#include <thread>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/signals.h"
#include "stage_runtime/executor.h"
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
  app.add_option("--region", o.region, "region label used by placement")->type_name("NAME");
  app.add_option("--device", o.device, "where the stage computes: cpu, cuda or cuda:N")->type_name("DEV");
  app.add_option("--data-dir", o.data_dir, "checkpoints and job files")->type_name("DIR");
  app.add_option("--threads", threads, "LibTorch intra-op threads (0: all cores)")->type_name("N");
  o.metrics_listen = "0.0.0.0:9465";
  CLI::Option* metrics_flag =
      app.add_option("--metrics-listen", o.metrics_listen,
                     "Prometheus /metrics endpoint, reported to the coordinator for its service discovery;\n"
                     "none: off. Port 0 picks a free one; the default port, if taken (several workers on\n"
                     "one host), falls back to a free one")
          ->type_name("HOST:PORT|none");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  o.metrics_fallback = metrics_flag->count() == 0;
  if (absl::StatusOr<torch::Device> d = longhaul::stage_runtime::ParseDevice(o.device); !d.ok()) {
    return longhaul::common::FlagError(app, "--device=" + o.device + ": " + std::string(d.status().message()));
  }
  if (threads < 0) return longhaul::common::FlagError(app, "--threads needs a non-negative integer");
  longhaul::common::TuneAllocatorForLargeFrames();
  if (threads > 0) {
    torch::set_num_threads(static_cast<int>(threads));
    torch::set_num_interop_threads(1);
  }

  if (!longhaul::common::InstallTerminationHandlers()) {
    std::fprintf(stderr, "longhaul-worker: cannot install signal handlers\n");
    return 1;
  }

  absl::StatusOr<std::unique_ptr<longhaul::worker::Worker>> w = longhaul::worker::Worker::Start(o);
  if (!w.ok()) {
    std::fprintf(stderr, "longhaul-worker: %s\n", std::string(w.status().message()).c_str());
    return 1;
  }
  longhaul::worker::Worker* worker = w->get();
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
