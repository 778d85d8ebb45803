// longhaul-bench: the project's benchmarks. Figures are printed, never asserted; each compares
// against a reference measured in the same run.
#include <map>
#include <optional>
#include <string>

#include "bench/benchmarks.h"
#include "common/flags.h"
#include "common/signals.h"

int main(int argc, char** argv) {
  using namespace longhaul::bench;
  longhaul::common::InstallCrashHandler(argv[0]);
  CLI::App app{
      "The project's benchmarks. Figures are printed, never asserted; each compares against a\n"
      "reference measured in the same run. `--json` gives machine-readable output.",
      "longhaul-bench"};
  app.option_defaults()->always_capture_default();  // inherited by the subcommands: defaults in --help
  app.require_subcommand(1);
  const std::map<std::string, BenchmarkRun> runs = {
      {"codec", AddCodecBench(app)},
      {"crc", AddCrcBench(app)},
      {"convergence", AddConvergenceBench(app)},
      {"transport", AddTransportBench(app)},
      {"sweep", AddSweepBench(app)},
      {"stage", AddStageBench(app)},
  };
  app.footer("`longhaul-bench BENCHMARK --help` shows a benchmark's flags.");
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  return runs.at(app.get_subcommands().front()->get_name())();
}
