// Process-wide malloc settings for a process that moves multi-MiB frames (the worker, the
// transport benchmark, the data-parallel sweep's replicas).
//
//   common::TuneAllocatorForLargeFrames();   // once, early, before the frames' threads start
//
// Keeps multi-MiB blocks (gRPC's socket read buffers, frames, tensors) in the heap for reuse
// instead of mmap/munmap per block, whose page faults and zeroing cost ~10% of a loopback
// transfer's CPU. It changes the whole process's allocator, which is why a library never calls it:
// only a main() that knows its process moves frames does.
#ifndef LONGHAUL_COMMON_ALLOCATOR_H_
#define LONGHAUL_COMMON_ALLOCATOR_H_

namespace longhaul::common {

void TuneAllocatorForLargeFrames();

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_ALLOCATOR_H_
