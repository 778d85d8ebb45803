#include "bench/sweep_plot.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace longhaul::bench {

std::string ThroughputSvg(const std::vector<PlotSeries>& series, const std::vector<double>& rates,
                          const std::vector<PlotPoint>& points) {
  const double W = 640, H = 400, L = 70, B = 50, T = 30, R = 140;
  double ymax = 1;
  for (const PlotPoint& p : points) ymax = std::max(ymax, p.tokens_per_s);
  const double lmin = rates.empty() ? 0 : std::log10(*std::min_element(rates.begin(), rates.end()));
  const double lmax =
      std::max(lmin + 1e-9, rates.empty() ? 0 : std::log10(*std::max_element(rates.begin(), rates.end())));
  auto X = [&](double rate) { return L + (std::log10(rate) - lmin) / (lmax - lmin) * (W - L - R); };
  auto Y = [&](double v) { return H - B - v / (ymax * 1.1) * (H - B - T); };
  const char* colours[] = {"#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd", "#8c564b"};
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n"
      "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n"
      "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">link rate (Mbit/s, log scale)</text>\n"
      "<text x=\"15\" y=\"%g\" transform=\"rotate(-90 15 %g)\" text-anchor=\"middle\">tokens/s</text>\n",
      W, H, L, H - B, W - R, H - B, L, H - B, L, T, (L + W - R) / 2, H - 10, (H - B + T) / 2, (H - B + T) / 2);
  for (double rate : rates) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%g</text>\n", X(rate), H - B + 18, rate);
  }
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * 1.1 * i / 4;
    absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6, Y(v) + 4, v);
  }
  for (size_t ci = 0; ci < series.size(); ++ci) {
    std::string pts;
    for (const PlotPoint& p : points) {
      if (p.series == series[ci].name) absl::StrAppendFormat(&pts, "%.1f,%.1f ", X(p.rate), Y(p.tokens_per_s));
    }
    const char* col = colours[ci % 6];
    absl::StrAppendFormat(&svg, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", col, pts);
    absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", W - R + 10, T + 18 * ci + 10, col,
                          series[ci].legend);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace longhaul::bench
