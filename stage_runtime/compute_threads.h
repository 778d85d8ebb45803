// The CPU threads one process's LibTorch compute uses, decided in one place.
//
// torch::set_num_threads sizes LibTorch's intra-op pool, but Debian's LibTorch does its matrix
// products in OpenBLAS (libblas.so.3 -> openblas-pthread), whose own pool keeps a thread per core
// whatever LibTorch was told, and whose idle threads spin (sched_yield) waiting for work. Several
// compute threads in one process (a worker's stages, the benchmarks' replicas) or several worker
// processes on one machine (the demo) then oversubscribe the cores with spinning threads: on the
// 2-core dev VM `longhaul-bench sweep --data-parallel` (8 stage-replica threads) took 0.198 s a
// sdp4bit step with OpenBLAS's default pool and 0.068 s with one thread (docs/replicated-stages.md).
// LibTorch builds on MKL (the torch wheel's) have no OpenBLAS: set_num_threads sizes MKL's pool.
#ifndef LONGHAUL_STAGE_RUNTIME_COMPUTE_THREADS_H_
#define LONGHAUL_STAGE_RUNTIME_COMPUTE_THREADS_H_

namespace longhaul::stage_runtime {

struct ComputeThreads {
  int threads = 0;
  bool openblas = false;  // whether the process's BLAS is OpenBLAS (its pool was sized too)
};

// Sizes LibTorch's intra-op pool and, when the process uses OpenBLAS, OpenBLAS's pool to `n`
// threads (n >= 1). Call it before the compute threads start.
ComputeThreads SetComputeThreads(int n);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_COMPUTE_THREADS_H_
