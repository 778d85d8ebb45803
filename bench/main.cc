// longhaul-bench: the project's benchmarks. Figures are printed, never asserted; each compares
// against a reference measured in the same run.
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/benchmarks.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: longhaul-bench <benchmark> [--flags] [--json]\n"
               "\n"
               "benchmarks:\n"
               "  codec        bits/element, relative L2 error, encode/decode GB/s vs memcpy\n"
               "  crc          CRC32C GB/s per implementation (plain and fused with a copy) vs memcpy\n"
               "  convergence  train a small GPT through the in-process pipeline with a link codec\n"
               "  transport    goodput of the gRPC data plane vs a plain TCP socket, two processes\n"
               "  sweep        a local cluster trained at several link rates and codecs (throughput table)\n"
               "\n"
               "longhaul-bench <benchmark> --help shows its flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string what = argv[1];
  if (what == "codec") return longhaul::bench::CodecBenchMain(argc - 2, argv + 2);
  if (what == "crc") return longhaul::bench::CrcBenchMain(argc - 2, argv + 2);
  if (what == "convergence") return longhaul::bench::ConvergenceBenchMain(argc - 2, argv + 2);
  if (what == "transport") return longhaul::bench::TransportBenchMain(argc - 2, argv + 2);
  if (what == "sweep") return longhaul::bench::SweepBenchMain(argc - 2, argv + 2);
  std::fprintf(stderr, "longhaul-bench: unknown benchmark \"%s\"\n", what.c_str());
  Usage(stderr);
  return 2;
}
