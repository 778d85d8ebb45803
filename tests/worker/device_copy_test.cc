// DeviceCopier / HostCopy: CPU tensors pass through untouched (the path every CPU link takes), and,
// where there is a GPU and the CUDA parts are built, a device tensor arrives on the host intact
// even when compute frees it right after the copy was started, and one handed to a link's stream
// for a device encode is encoded as the CPU would encode it.
#include "worker/device_copy.h"

#include <thread>

#include <c10/core/StreamGuard.h>
#include <gtest/gtest.h>

#include "codec/codec.h"

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

// The device-encode hand-over (DeviceUse): the link's stream waits for the compute that wrote the
// tensor, the encode runs there on another thread with it as LibTorch's current stream, and the
// frame equals the CPU's, even though compute dropped the tensor and queued more work (which
// reuses freed blocks) before the encode started.
TEST(DeviceCopyTest, DeviceEncodeOnTheLinkStreamSeesTheFinishedTensor) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "SKIPPED: no CUDA device";
  if (!codec::GpuCodecsAvailable()) GTEST_SKIP() << "SKIPPED: no GPU codecs in this build";
  DeviceCopier copier;
  const torch::Device dev(torch::kCUDA, 0);
  absl::StatusOr<std::unique_ptr<codec::Codec>> tah = codec::MakeCodec("tahquant");
  ASSERT_TRUE(tah.ok()) << tah.status();
  torch::manual_seed(3);
  torch::Tensor w = torch::randn({2048, 2048}, torch::TensorOptions().device(dev)) / 45.0;
  torch::Tensor x = torch::randn({2048, 2048}, torch::TensorOptions().device(dev));
  for (int i = 0; i < 20; ++i) x = torch::tanh(torch::matmul(x, w));  // long work for the stream
  absl::StatusOr<DeviceUse> use = copier.StartDeviceUse(x);
  ASSERT_TRUE(use.ok()) << use.status();
  ASSERT_TRUE(use->stream.has_value());
  ASSERT_NE(use->cuda_stream, nullptr);
  const torch::Tensor want_host = x.to(torch::kCPU);  // the compute stream's view, for the reference
  torch::Tensor handed = x;
  x = torch::Tensor();
  for (int i = 0; i < 20; ++i) (void)torch::full({2048, 2048}, 7.0f, torch::TensorOptions().device(dev));
  absl::StatusOr<std::string> frame = absl::InternalError("not run");
  std::thread encoder([&] {
    const c10::StreamGuard on_link(*use->stream);
    codec::EncodeOptions eo;
    eo.device = codec::CodecDevice::kGpu;
    eo.cuda_stream = use->cuda_stream;
    frame = (*tah)->Encode(handed, eo);
    handed = torch::Tensor();
  });
  encoder.join();
  ASSERT_TRUE(frame.ok()) << frame.status();
  absl::StatusOr<std::string> want = (*tah)->Encode(want_host);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(*frame == *want) << "the frame encoded on the link's stream differs from the CPU's";
}
#endif

}  // namespace
}  // namespace longhaul::worker
