// The CUDA symmetric quantiser (sdp4bit-*, zeropp-*) and BitDP against the CPU scalar reference:
// payloads byte for byte, decoded floats bit for bit, over odd sizes, special values and both
// input dtypes. Skipped (with the reason) where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/bitdp.h"
#include "codec/cpu/kernels.h"
#include "codec/cuda/gpu_codec.h"
#include "codec/frame.h"
#include "codec/hd.h"
#include "codec/sym_quant.h"

namespace longhaul::codec {
namespace {

#define SKIP_WITHOUT_GPU()                            \
  do {                                                \
    std::string why_;                                 \
    if (!gpu::Available(&why_)) GTEST_SKIP() << why_; \
  } while (0)

// Host bf16 <-> float, round to nearest even (NaN stays a quiet NaN).
uint16_t FloatToBf16(float f) {
  const uint32_t b = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// Mostly normal values, a few large outliers (heavy tail), exact zeros and negative zeros.
std::vector<float> HeavyTailed(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    v = normal(rng);
    const float r = u(rng);
    if (r < 0.005f)
      v *= 1000.0f;
    else if (r < 0.02f)
      v = 0.0f;
    else if (r < 0.025f)
      v = -0.0f;
  }
  return x;
}

// HeavyTailed plus NaN, +-Inf, an all-zero stretch (whole groups of every size tested for large
// n) and a stretch of tiny values (subnormals, and scales so small that Q / s overflows).
std::vector<float> WithSpecials(int64_t n, uint32_t seed) {
  std::vector<float> x = HeavyTailed(n, seed);
  for (int64_t i = n / 8; i < n / 4; ++i) x[i] = 0.0f;
  for (int64_t i = n / 4; i < std::min<int64_t>(n, n / 4 + 64); ++i)
    x[i] *= (i % 3 == 0) ? 1e-40f : 1e-38f;
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  if (n > 5) x[5] = nan;
  x[n / 2] = nan;
  if (n >= 8) x[3 * n / 4] = inf;
  if (n >= 100) x[n - 1] = -inf;
  return x;
}

// Index of the first differing byte, or -1.
int64_t FirstDiff(const std::string& a, const std::string& b) {
  const size_t m = std::min(a.size(), b.size());
  for (size_t i = 0; i < m; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(m);
}

// The input as the GPU gets it (fp32 or bf16 bytes) and as the CPU reference sees it (floats).
struct Input {
  std::vector<float> ref;
  gpu::DeviceBuffer dev;
  FrameDtype dtype;
};

Input MakeInput(const std::vector<float>& x, FrameDtype dtype) {
  Input in;
  in.dtype = dtype;
  in.ref = x;
  absl::StatusOr<gpu::DeviceBuffer> buf;
  if (dtype == FrameDtype::kBFloat16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      h[i] = FloatToBf16(x[i]);
      in.ref[i] = Bf16ToFloat(h[i]);
    }
    buf = gpu::DeviceBuffer::Allocate(h.size() * 2);
    if (buf.ok()) {
      EXPECT_TRUE(gpu::Upload(buf->data(), h.data(), h.size() * 2, nullptr).ok());
    }
  } else {
    buf = gpu::DeviceBuffer::Allocate(x.size() * 4);
    if (buf.ok()) {
      EXPECT_TRUE(gpu::Upload(buf->data(), x.data(), x.size() * 4, nullptr).ok());
    }
  }
  if (!buf.ok()) {
    ADD_FAILURE() << buf.status();
    return in;
  }
  in.dev = std::move(*buf);
  return in;
}

const char* DtypeName(FrameDtype d) { return d == FrameDtype::kBFloat16 ? "bf16" : "fp32"; }

// ------------------------------------------------------------------------- symmetric quantisation

// Encodes `in` on both sides and compares payloads, then decodes both and compares the floats.
// Returns false after reporting a failure.
bool CheckSymQuant(const Input& in, int64_t n, const SymQuantParams& p, uint64_t seed,
                   int64_t offset, gpu::Workspace& ws, gpu::DeviceBuffer& out_dev,
                   const std::string& what) {
  const std::string ctx =
      absl::StrCat(what, " bits=", p.bits, " g=", p.group_size, " hadamard=", p.hadamard,
                   " stochastic=", p.rounding == Rounding::kStochastic, " seed=", seed,
                   " offset=", offset, " n=", n, " ", DtypeName(in.dtype));
  std::string want;
  SymQuantEncode(in.ref.data(), n, p, seed, &want, offset, ScalarKernels());
  absl::StatusOr<gpu::DeviceBytes> enc =
      gpu::SymQuantEncode(in.dev.data(), in.dtype, n, p, seed, ws, nullptr, offset);
  if (!enc.ok()) {
    ADD_FAILURE() << ctx << ": " << enc.status();
    return false;
  }
  std::string got;
  if (absl::Status s = gpu::AppendToHost(*enc, nullptr, &got); !s.ok()) {
    ADD_FAILURE() << ctx << ": " << s;
    return false;
  }
  if (const int64_t d = FirstDiff(want, got); d >= 0) {
    ADD_FAILURE() << ctx << ": payloads differ at byte " << d << " of " << want.size() << " (GPU "
                  << got.size() << " bytes; scales take "
                  << 4 * ((n + p.group_size - 1) / p.group_size) << ")";
    return false;
  }
  if (absl::Status s = SymQuantValidate(want, n, p, ScalarKernels()); !s.ok()) {
    ADD_FAILURE() << ctx << ": " << s;
    return false;
  }
  std::vector<float> cpu_out(static_cast<size_t>(n)), gpu_out(static_cast<size_t>(n));
  SymQuantDecode(want, n, p, {}, cpu_out.data(), ScalarKernels());
  absl::Status s =
      gpu::SymQuantDecode(enc->data, n, p, static_cast<float*>(out_dev.data()), nullptr);
  if (s.ok())
    s = gpu::Download(gpu_out.data(), out_dev.data(), static_cast<size_t>(n) * 4, nullptr);
  if (!s.ok()) {
    ADD_FAILURE() << ctx << ": decode: " << s;
    return false;
  }
  if (std::memcmp(cpu_out.data(), gpu_out.data(), static_cast<size_t>(n) * 4) != 0) {
    int64_t i = 0;
    while (FloatBits(cpu_out[i]) == FloatBits(gpu_out[i])) ++i;
    ADD_FAILURE() << ctx << ": decoded element " << i << " is " << gpu_out[i] << " on the GPU, "
                  << cpu_out[i] << " on the CPU";
    return false;
  }
  return true;
}

// Every combination of the listed sizes, widths and group sizes, with and without the transform,
// nearest and stochastic rounding (seeds 0 and 12345), index offsets 0 and 77, fp32 and bf16
// input, plain and with special values. Widths that do not divide 8 (codes straddling bytes) run
// a reduced set of rounding/offset pairs to keep the time down.
void SweepSymQuant(const std::vector<int64_t>& sizes, const std::vector<int>& widths,
                   const std::vector<int>& groups) {
  gpu::Workspace ws;
  const int64_t max_n = *std::max_element(sizes.begin(), sizes.end());
  absl::StatusOr<gpu::DeviceBuffer> out_dev = gpu::DeviceBuffer::Allocate(max_n * 4);
  ASSERT_TRUE(out_dev.ok()) << out_dev.status();
  int failures = 0, checked = 0;
  for (int64_t n : sizes) {
    for (bool specials : {false, true}) {
      const std::vector<float> x = specials ? WithSpecials(n, 7 + n) : HeavyTailed(n, 3 + n);
      for (FrameDtype dtype : {FrameDtype::kFloat32, FrameDtype::kBFloat16}) {
        const Input in = MakeInput(x, dtype);
        for (int bits : widths) {
          for (int g : groups) {
            for (bool hadamard : {false, true}) {
              if (hadamard && g % kHadamardBlock != 0) continue;
              for (int mode = 0; mode < 3; ++mode) {  // nearest; stochastic with seed 0, 12345
                const SymQuantParams p{bits, g, hadamard,
                                       mode == 0 ? Rounding::kNearest : Rounding::kStochastic};
                const uint64_t seed = mode == 2 ? 12345 : 0;
                for (int64_t offset : {0, 77}) {
                  if (specials && offset != 0) continue;
                  if (8 % bits != 0 && !((mode == 0 && offset == 0) || (mode == 2 && offset == 77)))
                    continue;
                  ++checked;
                  if (!CheckSymQuant(in, n, p, seed, offset, ws, *out_dev,
                                     specials ? "specials" : "plain") &&
                      ++failures >= 5) {
                    FAIL() << "stopping after 5 failures";
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "of " << checked << " combinations";
}

TEST(GpuSymQuantTest, PayloadsAndDecodingMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  SweepSymQuant({1, 7, 31, 33, 127, 1000, 4097, 100000}, {2, 3, 4, 5, 6, 7, 8}, {8, 32, 128, 4096});
}

// The other launch shapes (sym_quant.cu): a sub-warp group of 16, groups of 2 and 8 chunks of a
// warp, of 2 and all 8 warps of a block, of several rounds, and the largest group (32 rounds, a
// short last group).
TEST(GpuSymQuantTest, OtherGroupSizes) {
  SKIP_WITHOUT_GPU();
  SweepSymQuant({33, 1000, 131073}, {3, 4}, {16, 64, 256, 512, 2048, 65536});
}

TEST(GpuSymQuantTest, AllZeroAndAllInfiniteInputs) {
  SKIP_WITHOUT_GPU();
  gpu::Workspace ws;
  const int64_t n = 4131;
  absl::StatusOr<gpu::DeviceBuffer> out_dev = gpu::DeviceBuffer::Allocate(n * 4);
  ASSERT_TRUE(out_dev.ok()) << out_dev.status();
  const std::vector<float> zeros(n, 0.0f), infs(n, std::numeric_limits<float>::infinity());
  for (const auto* x : {&zeros, &infs}) {
    const Input in = MakeInput(*x, FrameDtype::kFloat32);
    for (bool hadamard : {false, true}) {
      const SymQuantParams p{4, 64, hadamard, Rounding::kStochastic};
      EXPECT_TRUE(CheckSymQuant(in, n, p, 9, 0, ws, *out_dev, x == &zeros ? "zeros" : "infs"));
    }
  }
}

TEST(GpuSymQuantTest, EmptyInputAndBadParameters) {
  SKIP_WITHOUT_GPU();
  gpu::Workspace ws;
  absl::StatusOr<gpu::DeviceBuffer> x = gpu::DeviceBuffer::Allocate(64);
  ASSERT_TRUE(x.ok());
  absl::StatusOr<gpu::DeviceBytes> p =
      gpu::SymQuantEncode(x->data(), FrameDtype::kFloat32, 0, {}, 0, ws, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size, 0u);
  EXPECT_FALSE(
      gpu::SymQuantEncode(x->data(), FrameDtype::kFloat32, 8, {9, 128}, 0, ws, nullptr).ok());
  EXPECT_FALSE(
      gpu::SymQuantEncode(x->data(), FrameDtype::kFloat32, 8, {4, 16, true}, 0, ws, nullptr).ok());
  EXPECT_FALSE(gpu::SymQuantEncode(x->data(), FrameDtype::kFloat32, -1, {}, 0, ws, nullptr).ok());
}

// ------------------------------------------------------------------------------------------ BitDP

TEST(GpuBitDpTest, PayloadsAndDecodingMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  gpu::Workspace ws;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 7}, {17, 33}, {64, 4096}, {5, 100001}};
  for (const auto& [rows, cols] : shapes) {
    std::vector<float> g = HeavyTailed(rows * cols, static_cast<uint32_t>(rows * 1000 + cols));
    if (rows > 1) std::fill(g.begin() + cols, g.begin() + 2 * cols, 0.0f);  // an all-zero row
    if (rows >= 17) {
      g[2 * cols + 3] = std::numeric_limits<float>::infinity();  // non-finite sums: scale 0
      g[3 * cols + 1] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t j = 0; j < cols; ++j) g[4 * cols + j] = -1.5f;  // every entry kept, all negative
    }
    absl::StatusOr<gpu::DeviceBuffer> out_dev = gpu::DeviceBuffer::Allocate(g.size() * 4);
    ASSERT_TRUE(out_dev.ok()) << out_dev.status();
    for (FrameDtype dtype : {FrameDtype::kFloat32, FrameDtype::kBFloat16}) {
      const Input in = MakeInput(g, dtype);
      for (int bits : {1, 2}) {
        const std::string ctx =
            absl::StrCat("[", rows, ", ", cols, "] bits=", bits, " ", DtypeName(dtype));
        std::string want;
        BitDpEncode(in.ref.data(), rows, cols, bits, &want);
        absl::StatusOr<gpu::DeviceBytes> enc =
            gpu::BitDpEncode(in.dev.data(), dtype, rows, cols, bits, ws, nullptr);
        ASSERT_TRUE(enc.ok()) << ctx << ": " << enc.status();
        std::string got;
        ASSERT_TRUE(gpu::AppendToHost(*enc, nullptr, &got).ok()) << ctx;
        const int64_t d = FirstDiff(want, got);
        ASSERT_EQ(d, -1) << ctx << ": payloads differ at byte " << d << " of " << want.size()
                         << " (scales take " << 4 * rows << ")";
        ASSERT_TRUE(BitDpValidate(want, rows, cols, bits).ok()) << ctx;
        std::vector<float> cpu_out(g.size()), gpu_out(g.size());
        BitDpDecode(want, rows, cols, bits, cpu_out.data());
        ASSERT_TRUE(gpu::BitDpDecode(enc->data, rows, cols, bits,
                                     static_cast<float*>(out_dev->data()), nullptr)
                        .ok());
        ASSERT_TRUE(gpu::Download(gpu_out.data(), out_dev->data(), g.size() * 4, nullptr).ok());
        for (size_t i = 0; i < g.size(); ++i) {
          ASSERT_EQ(FloatBits(cpu_out[i]), FloatBits(gpu_out[i]))
              << ctx << ": decoded element " << i << " is " << gpu_out[i] << " on the GPU, "
              << cpu_out[i] << " on the CPU";
        }
      }
    }
  }
}

TEST(GpuBitDpTest, EmptyShapesAndBadBits) {
  SKIP_WITHOUT_GPU();
  gpu::Workspace ws;
  absl::StatusOr<gpu::DeviceBuffer> x = gpu::DeviceBuffer::Allocate(64);
  ASSERT_TRUE(x.ok());
  absl::StatusOr<gpu::DeviceBytes> p =
      gpu::BitDpEncode(x->data(), FrameDtype::kFloat32, 0, 5, 2, ws, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size, 0u);
  // Rows of no columns: a zero scale each, as the CPU.
  p = gpu::BitDpEncode(x->data(), FrameDtype::kFloat32, 3, 0, 2, ws, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  std::string got, want;
  ASSERT_TRUE(gpu::AppendToHost(*p, nullptr, &got).ok());
  BitDpEncode(nullptr, 3, 0, 2, &want);
  EXPECT_EQ(got, want);
  EXPECT_FALSE(gpu::BitDpEncode(x->data(), FrameDtype::kFloat32, 1, 1, 3, ws, nullptr).ok());
}

}  // namespace
}  // namespace longhaul::codec
