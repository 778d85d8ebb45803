// longhaul-bench crc: CRC32C throughput of every implementation the CPU can run (codec/crc32c.h),
// plain and fused with a copy, against memcpy of the same buffer in the same run.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/benchmarks.h"
#include "codec/crc32c.h"
#include "tools/cli/args.h"

namespace longhaul::bench {
namespace {

constexpr char kHelp[] =
    "usage: longhaul-bench crc [--bytes=N] [--seconds=S] [--json]\n"
    "\n"
    "CRC32C GB/s over a buffer of --bytes (default 4194304, a frame) for each implementation this\n"
    "CPU runs (reference, sse42, vpclmul), alone and fused with a copy (what the receive path does),\n"
    "next to memcpy of the same buffer. Each figure repeats for --seconds (default 0.3).\n"
    "JSON fields: bytes, memcpy_gbps, then <path>_gbps and <path>_copy_gbps per available path.\n";

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

}  // namespace

int CrcBenchMain(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, {"bytes", "seconds", "json", "help"});
  if (std::optional<int> rc = cli::ExitForParseErrorOrHelp(args, "longhaul-bench crc", kHelp)) return *rc;
  auto bytes = args->Int("bytes", 4 << 20);
  auto seconds = args->Double("seconds", 0.3);
  if (!bytes.ok() || !seconds.ok() || *bytes < 1 || *bytes > (int64_t{1} << 30) || *seconds <= 0 || *seconds > 60) {
    std::fprintf(stderr, "longhaul-bench crc: --bytes must be in [1, 2^30] and --seconds in (0, 60]\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(*bytes);
  std::vector<uint8_t> src(n), dst(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  volatile uint32_t sink = 0;
  std::vector<std::string> json = {absl::StrFormat("\"bytes\": %d", n)};
  const double memcpy_gbps = Gbps(n, *seconds, [&] { std::memcpy(dst.data(), src.data(), n); });
  json.push_back(absl::StrFormat("\"memcpy_gbps\": %.2f", memcpy_gbps));
  if (!args->Bool("json")) std::printf("%zu bytes: memcpy %.2f GB/s\n", n, memcpy_gbps);
  const std::pair<codec::Crc32cPath, const char*> paths[] = {
      {codec::Crc32cPath::kReference, "reference"}, {codec::Crc32cPath::kSse42, "sse42"}, {codec::Crc32cPath::kVpclmul, "vpclmul"}};
  for (const auto& [path, name] : paths) {
    if (!codec::Crc32cPathAvailable(path)) {
      if (!args->Bool("json")) std::printf("  %-9s  not available on this CPU\n", name);
      continue;
    }
    const double plain = Gbps(n, *seconds, [&, p = path] { sink = codec::Crc32cExtendWith(p, 0, src.data(), n); });
    const double copy = Gbps(n, *seconds, [&, p = path] { sink = codec::Crc32cCopyExtendWith(p, 0, dst.data(), src.data(), n); });
    json.push_back(absl::StrFormat("\"%s_gbps\": %.2f, \"%s_copy_gbps\": %.2f", name, plain, name, copy));
    if (!args->Bool("json")) std::printf("  %-9s  %7.2f GB/s   copy + CRC %7.2f GB/s\n", name, plain, copy);
  }
  (void)sink;
  if (args->Bool("json")) std::printf("{%s}\n", absl::StrJoin(json, ", ").c_str());
  return 0;
}

}  // namespace longhaul::bench
