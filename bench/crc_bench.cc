// longhaul-bench crc: CRC32C throughput of every implementation the CPU can run (codec/crc32c.h),
// plain and fused with a copy, against memcpy of the same buffer in the same run.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/benchmarks.h"
#include "codec/crc32c.h"
#include "common/flags.h"

namespace longhaul::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double Gbps(size_t bytes, double seconds, F f) {
  f();  // warm
  int64_t iterations = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {
    f();
    ++iterations;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (s < seconds);
  return static_cast<double>(bytes) * static_cast<double>(iterations) / s / 1e9;
}

struct Flags {
  int64_t bytes = 4 << 20;
  double seconds = 0.3;
  bool json = false;
};

int Run(const Flags& f, const CLI::App& cmd) {
  if (f.bytes < 1 || f.bytes > (int64_t{1} << 30) || f.seconds <= 0 || f.seconds > 60) {
    return common::FlagError(cmd, "--bytes must be in [1, 2^30] and --seconds in (0, 60]");
  }
  const size_t n = static_cast<size_t>(f.bytes);
  std::vector<uint8_t> src(n), dst(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  volatile uint32_t sink = 0;
  const double memcpy_gbps = Gbps(n, f.seconds, [&] { std::memcpy(dst.data(), src.data(), n); });
  nlohmann::ordered_json json = {{"bytes", n}, {"memcpy_gbps", Round(memcpy_gbps, 2)}};
  if (!f.json) std::printf("%zu bytes: memcpy %.2f GB/s\n", n, memcpy_gbps);
  const std::pair<codec::Crc32cPath, const char*> paths[] = {
      {codec::Crc32cPath::kReference, "reference"}, {codec::Crc32cPath::kSse42, "sse42"}, {codec::Crc32cPath::kVpclmul, "vpclmul"}};
  for (const auto& [path, name] : paths) {
    if (!codec::Crc32cPathAvailable(path)) {
      if (!f.json) std::printf("  %-9s  not available on this CPU\n", name);
      continue;
    }
    const double plain = Gbps(n, f.seconds, [&, p = path] { sink = codec::Crc32cExtendWith(p, 0, src.data(), n); });
    const double copy =
        Gbps(n, f.seconds, [&, p = path] { sink = codec::Crc32cCopyExtendWith(p, 0, dst.data(), src.data(), n); });
    json[std::string(name) + "_gbps"] = Round(plain, 2);
    json[std::string(name) + "_copy_gbps"] = Round(copy, 2);
    if (!f.json) std::printf("  %-9s  %7.2f GB/s   copy + CRC %7.2f GB/s\n", name, plain, copy);
  }
  (void)sink;
  if (f.json) std::printf("%s\n", json.dump().c_str());
  return 0;
}

}  // namespace

BenchmarkRun AddCrcBench(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("crc", "CRC32C GB/s per implementation (plain and fused with a copy) vs memcpy");
  cmd->footer(
      "CRC32C GB/s over a buffer of --bytes for each implementation this CPU runs (reference, sse42,\n"
      "vpclmul), alone and fused with a copy (what the receive path does), next to memcpy of the same\n"
      "buffer.");
  cmd->add_option("--bytes", f->bytes, "buffer size, 1..2^30 (default: a frame)")->type_name("N");
  cmd->add_option("--seconds", f->seconds, "time each figure repeats for, (0, 60]")->type_name("S");
  cmd->add_flag("--json", f->json,
                "JSON: bytes, memcpy_gbps, then <path>_gbps and <path>_copy_gbps per available path");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
