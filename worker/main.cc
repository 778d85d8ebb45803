// longhaul-worker: the worker daemon. Hosts a pipeline stage when the coordinator assigns one.
#include <cstdio>
#include <thread>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "tools/cli/args.h"
#include "tools/cli/log.h"
#include "tools/cli/signals.h"
#include "worker/worker.h"

namespace {

constexpr char kUsage[] =
    "usage: longhaul-worker [--flags]\n"
    "\n"
    "Registers with the coordinator, then trains the pipeline stage it is assigned, streaming\n"
    "compressed activations and gradients to its neighbour stages over gRPC. Runs until SIGTERM or\n"
    "SIGINT, which stop the running job (reported as failed) and exit cleanly.\n"
    "\n"
    "flags:\n"
    "  --coordinator=HOST:PORT  coordinator address (default localhost:7400)\n"
    "  --listen=HOST:PORT       data-plane listen address (default 0.0.0.0:0, a free port)\n"
    "  --advertise-host=HOST    host neighbours use to reach this worker (default: the listen host,\n"
    "                           127.0.0.1 when listening on 0.0.0.0)\n"
    "  --name=NAME              worker name, unique among live workers (default HOSTNAME-PORT)\n"
    "  --region=NAME            region label used by placement (default local)\n"
    "  --device=DEV             cpu (default); cuda:N once GPU stages land\n"
    "  --data-dir=DIR           checkpoints and job files (default /tmp/longhaul-worker)\n"
    "  --threads=N              LibTorch intra-op threads (default: all cores)\n"
    "  --help                   this text\n";

}  // namespace

int main(int argc, char** argv) {
  using longhaul::cli::Args;
  absl::StatusOr<Args> args = Args::Parse(argc - 1, argv + 1,
                                          {"coordinator", "listen", "advertise-host", "name", "region",
                                           "device", "data-dir", "threads", "help"});
  if (std::optional<int> rc = longhaul::cli::ExitForParseErrorOrHelp(args, "longhaul-worker", kUsage)) return *rc;
  longhaul::worker::TuneAllocatorForLargeFrames();
  longhaul::worker::WorkerOptions o;
  o.coordinator = args->Str("coordinator", o.coordinator);
  o.listen = args->Str("listen", o.listen);
  o.advertise_host = args->Str("advertise-host", "");
  o.name = args->Str("name", "");
  o.region = args->Str("region", o.region);
  o.device = args->Str("device", o.device);
  o.data_dir = args->Str("data-dir", o.data_dir);
  if (o.device != "cpu") {
    std::fprintf(stderr, "longhaul-worker: --device=%s: only cpu stages exist in this build\n", o.device.c_str());
    return 2;
  }
  absl::StatusOr<int64_t> threads = args->Int("threads", 0);
  if (!threads.ok() || *threads < 0) {
    std::fprintf(stderr, "longhaul-worker: --threads needs a non-negative integer\n");
    return 2;
  }
  if (*threads > 0) {
    torch::set_num_threads(static_cast<int>(*threads));
    torch::set_num_interop_threads(1);
  }

  if (!longhaul::cli::InstallTerminationHandlers()) {
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
    const int sig = longhaul::cli::WaitForTerminationSignal();
    longhaul::cli::Log(absl::StrCat("worker ", worker->name()),
                       absl::StrCat(longhaul::cli::SignalName(sig), ": shutting down"));
    worker->Shutdown();
  });
  signals.detach();
  worker->Run();
  w->reset();
  return 0;
}
