#include "stage_runtime/compute_threads.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace longhaul::stage_runtime {
namespace {

// OpenBLAS's own count, when the process has OpenBLAS (-1 otherwise).
int OpenBlasThreads() {
  using GetFn = int (*)();
  void* f = dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
  return f == nullptr ? -1 : reinterpret_cast<GetFn>(f)();
}

TEST(ComputeThreadsTest, SizesLibTorchsPoolAndOpenBlasesToo) {
  const int before = torch::get_num_threads();
  for (int n : {2, 1}) {
    const ComputeThreads c = SetComputeThreads(n);
    EXPECT_EQ(c.threads, n);
    EXPECT_EQ(torch::get_num_threads(), n);
    EXPECT_EQ(c.openblas, OpenBlasThreads() >= 0);
    if (c.openblas) {
      EXPECT_EQ(OpenBlasThreads(), n);
    }
  }
  EXPECT_EQ(SetComputeThreads(0).threads, 1) << "fewer than one thread is one";
  if (OpenBlasThreads() < 0) GTEST_LOG_(INFO) << "this LibTorch has no OpenBLAS: only its own pool was sized";
  SetComputeThreads(before);
}

}  // namespace
}  // namespace longhaul::stage_runtime
