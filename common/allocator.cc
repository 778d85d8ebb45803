#include "common/allocator.h"

#include <malloc.h>

namespace longhaul::common {

void TuneAllocatorForLargeFrames() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);   // blocks below 64 MiB come from (and return to) the heap
  mallopt(M_TRIM_THRESHOLD, 256 << 20);  // and freed memory stays mapped up to 256 MiB
}

}  // namespace longhaul::common
