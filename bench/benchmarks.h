// longhaul-bench's sub-commands. Each Add*Bench declares its subcommand on longhaul-bench's
// command line (flags, defaults, help) and returns the function that runs the benchmark with the
// parsed flags and returns the process exit status.
#ifndef LONGHAUL_BENCH_BENCHMARKS_H_
#define LONGHAUL_BENCH_BENCHMARKS_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace longhaul::bench {

using BenchmarkRun = std::function<int()>;

BenchmarkRun AddCodecBench(CLI::App& app);
BenchmarkRun AddCrcBench(CLI::App& app);
BenchmarkRun AddConvergenceBench(CLI::App& app);
BenchmarkRun AddTransportBench(CLI::App& app);
BenchmarkRun AddSweepBench(CLI::App& app);
BenchmarkRun AddStageBench(CLI::App& app);

// A figure for JSON output, rounded to `decimals` places: measurements are not precise to 17
// digits, and rounded values print short.
inline double Round(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

// The median of `v` (the mean of the middle two for an even count; 0 for none).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The median of get(s) over the samples s (the sweeps' rounds of one cell).
template <typename Sample, typename Get>
double MedianOf(const std::vector<Sample>& samples, const Get& get) {
  std::vector<double> x;
  x.reserve(samples.size());
  for (const Sample& s : samples) x.push_back(get(s));
  return Median(std::move(x));
}

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_BENCHMARKS_H_
