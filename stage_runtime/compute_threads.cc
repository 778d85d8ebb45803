#include "stage_runtime/compute_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>

namespace longhaul::stage_runtime {

ComputeThreads SetComputeThreads(int n) {
  ComputeThreads out;
  out.threads = std::max(1, n);
  torch::set_num_threads(out.threads);
  // OpenBLAS is not a dependency of ours, only (through libblas.so.3) of LibTorch's, so its setter
  // is looked up in the process's global scope rather than linked: absent, there is nothing to size.
  using SetFn = void (*)(int);
  if (void* f = dlsym(RTLD_DEFAULT, "openblas_set_num_threads"); f != nullptr) {
    reinterpret_cast<SetFn>(f)(out.threads);
    out.openblas = true;
  }
  return out;
}

}  // namespace longhaul::stage_runtime
