// DeviceCopier / HostCopy: CPU tensors pass through untouched (the path every CPU link takes), and,
// where there is a GPU and the CUDA parts are built, a device tensor arrives on the host intact
// even when compute frees it right after the copy was started.
#include "worker/device_copy.h"

#include <gtest/gtest.h>

namespace longhaul::worker {
namespace {

TEST(DeviceCopyTest, CpuTensorComesBackAsItIs) {
  DeviceCopier copier;
  const torch::Tensor x = torch::randn({4, 8, 16});
  absl::StatusOr<HostCopy> c = copier.StartHostCopy(x);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->pending());
  absl::StatusOr<torch::Tensor> h = c->Wait();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->device().is_cpu());
  EXPECT_EQ(h->data_ptr(), x.data_ptr());  // no copy
  EXPECT_TRUE(torch::equal(*h, x));
}

TEST(DeviceCopyTest, CpuTensorKeepsDtypeAndLayout) {
  DeviceCopier copier;
  const torch::Tensor x = torch::randn({6, 10}).to(torch::kBFloat16).t();  // not contiguous
  absl::StatusOr<HostCopy> c = copier.StartHostCopy(x);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<torch::Tensor> h = c->Wait();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->scalar_type(), torch::kBFloat16);
  EXPECT_EQ(h->sizes(), x.sizes());
  EXPECT_TRUE(torch::equal(*h, x));
  // Waiting again is harmless and gives the same tensor.
  absl::StatusOr<torch::Tensor> again = c->Wait();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data_ptr(), h->data_ptr());
}

TEST(DeviceCopyTest, DefaultHostCopyIsEmpty) {
  HostCopy c;
  EXPECT_FALSE(c.pending());
  absl::StatusOr<torch::Tensor> h = c.Wait();
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->defined());
}

#ifdef LONGHAUL_WITH_CUDA
TEST(DeviceCopyTest, CudaTensorArrivesIntactWhileComputeMovesOn) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "SKIPPED: no CUDA device";
  DeviceCopier copier;
  const torch::Device dev(torch::kCUDA, 0);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::Tensor x = torch::randn({64, 1024, 768}, torch::TensorOptions().device(dev)).to(dtype);
    const torch::Tensor want = x.to(torch::kCPU);
    torch::Tensor view = x.transpose(0, 1);  // not contiguous: the copy must gather
    const torch::Tensor want_view = view.to(torch::kCPU);
    absl::StatusOr<HostCopy> a = copier.StartHostCopy(x);
    absl::StatusOr<HostCopy> b = copier.StartHostCopy(view);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(a->pending());
    // Compute goes on and drops the tensors: without recordStream the caching allocator would hand
    // their blocks to the next allocation on the compute stream, which would zero them before (or
    // while) the copy stream reads them.
    view = torch::Tensor();
    x = torch::Tensor();
    torch::Tensor other = torch::zeros({64, 1024, 768}, torch::TensorOptions().device(dev).dtype(dtype));
    absl::StatusOr<torch::Tensor> ha = a->Wait();
    absl::StatusOr<torch::Tensor> hb = b->Wait();
    ASSERT_TRUE(ha.ok()) << ha.status();
    ASSERT_TRUE(hb.ok()) << hb.status();
    EXPECT_TRUE(ha->is_pinned());
    EXPECT_EQ(ha->scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(*hb, want_view));
    EXPECT_TRUE(torch::equal(*ha, want));
  }
}
#endif

}  // namespace
}  // namespace longhaul::worker
