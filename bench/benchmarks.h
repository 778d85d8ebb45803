// Entry points of longhaul-bench's sub-commands; each takes the arguments after its name and
// returns the process exit code.
#ifndef LONGHAUL_BENCH_BENCHMARKS_H_
#define LONGHAUL_BENCH_BENCHMARKS_H_

namespace longhaul::bench {

int CodecBenchMain(int argc, char** argv);
int CrcBenchMain(int argc, char** argv);
int ConvergenceBenchMain(int argc, char** argv);
int TransportBenchMain(int argc, char** argv);
int SweepBenchMain(int argc, char** argv);

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_BENCHMARKS_H_
