// The throughput sweep's plot (sweep_bench.cc, --svg): tokens/s against the link rate on a log
// scale, one polyline per forward codec. Plain SVG, no dependencies.
#ifndef LONGHAUL_BENCH_SWEEP_PLOT_H_
#define LONGHAUL_BENCH_SWEEP_PLOT_H_

#include <string>
#include <vector>

namespace longhaul::bench {

struct PlotPoint {
  std::string series;  // the codec
  double rate = 0;     // Mbit/s, > 0
  double tokens_per_s = 0;
};
struct PlotSeries {
  std::string name, legend;  // name: the points' series
};
// `series`: the polylines in legend order, each with its legend text; `rates`: the x axis's ticks.
std::string ThroughputSvg(const std::vector<PlotSeries>& series, const std::vector<double>& rates,
                          const std::vector<PlotPoint>& points);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_SWEEP_PLOT_H_
