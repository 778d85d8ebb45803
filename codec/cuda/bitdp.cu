// BitDP 1-/2-bit on a CUDA device (gpu_codec.h): byte-identical to codec::BitDpEncode and
// bit-identical to codec::BitDpDecode.
//
// Encode: a warp per row. The CPU sums |g| (and, for 2 bits, |g| of the kept entries) in double in
// 32 lanes, lane j taking the columns j mod 32 in order, combined by ReduceLanes32; here lane l
// accumulates columns l, l + 32, ... in order and the xor-shuffle butterfly combines the lanes in
// the same pairs (cuda_util.cuh, WarpSumLanes32). The bit planes come from ballots: in a 32-column
// step the ballot's four little-endian bytes are exactly the plane's four bytes (columns past the
// row vote 0, so padding bits are zero). Rows wider than a few thousand columns with very few rows
// leave most of the GPU idle; BitDP's matrices (linear weights) have many rows.
// Decode: a thread per element, out = 0.0f + s * float(plus - minus), the float operations of the
// CPU's one-payload exact reduction (a zeroed row accumulated once).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "codec/bitdp.h"
#include "codec/cuda/cuda_util.cuh"
#include "codec/cuda/gpu_codec.h"
#include "codec/hd.h"

namespace longhaul::codec::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
// The payload lives in the workspace slot every encoder uses for it (group_quant.cu's kPayload),
// valid until the workspace's next encode.
constexpr int kPayloadSlot = Workspace::kSlots - 1;

// Lanes 0..3 store the ballot `m` of columns base..base + 31 as plane bytes base / 8 + lane.
__device__ __forceinline__ void StoreBallot(uint8_t* plane, int64_t base, int lane, uint32_t m,
                                            int64_t pb) {
  if (lane < 4 && base / 8 + lane < pb)
    plane[base / 8 + lane] = static_cast<uint8_t>(m >> (8 * lane));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BitDpEncodeKernel(const T* __restrict__ g, int64_t rows, int64_t cols, int bits, int64_t pb,
                      float* scales, uint8_t* planes) {
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (i >= rows) return;  // the whole warp: no block-wide synchronisation below
  const T* row = g + i * cols;

  double acc = 0;
  for (int64_t j = lane; j < cols; j += kWarp) acc += static_cast<double>(fabsf(LoadF(row, j)));
  const double abs_sum = WarpSumLanes32(acc);
  const double mean_abs = cols > 0 ? abs_sum / static_cast<double>(cols) : 0.0;

  uint8_t* plus = planes + i * bits * pb;
  float s;
  if (bits == 1) {
    for (int64_t base = 0; base < cols; base += kWarp) {
      const int64_t j = base + lane;
      const bool pos = j < cols && LoadF(row, j) >= 0.0f;
      StoreBallot(plus, base, lane, __ballot_sync(kFullMask, pos), pb);
    }
    s = static_cast<float>(mean_abs);
  } else {
    uint8_t* minus = plus + pb;
    const float alpha = static_cast<float>(kBitDpAlpha * mean_abs);
    double kept_acc = 0;
    long long kept = 0;
    for (int64_t base = 0; base < cols; base += kWarp) {
      const int64_t j = base + lane;
      bool up = false, down = false;
      if (j < cols) {
        const float v = LoadF(row, j);
        if (v >= alpha) {
          up = true;
        } else if (v < -alpha) {
          down = true;
        }
        if (up || down) {
          kept_acc += static_cast<double>(fabsf(v));
          ++kept;
        }
      }
      StoreBallot(plus, base, lane, __ballot_sync(kFullMask, up), pb);
      StoreBallot(minus, base, lane, __ballot_sync(kFullMask, down), pb);
    }
    const double kept_sum = WarpSumLanes32(kept_acc);
    const long long kept_total = WarpSumLanes32(kept);
    s = kept_total > 0 ? static_cast<float>(kept_sum / static_cast<double>(kept_total)) : 0.0f;
  }
  if (!isfinite(s)) s = 0.0f;
  if (lane == 0) scales[i] = s;
}

// A float stored little-endian at any byte offset (payloads need not be aligned).
__device__ __forceinline__ float LoadScale(const uint8_t* b, int64_t i) {
  const uint8_t* p = b + 4 * i;
  return BitsFloat(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                   static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

__global__ void __launch_bounds__(kThreads)
    BitDpDecodeKernel(const uint8_t* __restrict__ payload, int64_t rows, int64_t cols, int bits,
                      int64_t pb, float* __restrict__ out) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t i = e / cols;
    const int64_t j = e - i * cols;
    const float w = LoadScale(payload, i);
    const uint8_t* plus = payload + 4 * rows + i * bits * pb;
    const int pbit = (plus[j >> 3] >> (j & 7)) & 1;
    const int mbit = bits == 1 ? 1 - pbit : (plus[pb + (j >> 3)] >> (j & 7)) & 1;
    // ReduceValidated: dst = 0 (memset), then dst += w * float(plus - minus).
    out[e] = 0.0f + w * static_cast<float>(pbit - mbit);
  }
}

absl::Status CheckShape(int64_t rows, int64_t cols, int bits) {
  if (bits != 1 && bits != 2)
    return absl::InvalidArgumentError(absl::StrCat("bitdp: bits ", bits, " is not 1 or 2"));
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("bitdp: negative shape");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceBytes> BitDpEncode(const void* x, FrameDtype dtype, int64_t rows, int64_t cols,
                                        int bits, Workspace& ws, Stream s) {
  if (absl::Status st = CheckShape(rows, cols, bits); !st.ok()) return st;
  const uint64_t bytes = BitDpPayloadBytes(rows, cols, bits);
  absl::StatusOr<void*> buf = ws.Scratch(kPayloadSlot, bytes);
  if (!buf.ok()) return buf.status();
  uint8_t* payload = static_cast<uint8_t*>(*buf);
  if (rows == 0) return DeviceBytes{payload, 0};
  const int64_t blocks = CeilDiv(rows, kWarps);
  if (blocks > INT_MAX) return absl::InvalidArgumentError(absl::StrCat("bitdp: ", rows, " rows"));
  const int64_t pb = (cols + 7) / 8;
  float* scales = reinterpret_cast<float*>(payload);  // workspace memory: aligned
  uint8_t* planes = payload + 4 * rows;
  absl::Status st = WithInputType(x, dtype, [&](auto* xt) -> absl::Status {
    BitDpEncodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(
        xt, rows, cols, bits, pb, scales, planes);
    return CudaStatus(cudaGetLastError(), "bitdp encode launch");
  });
  if (!st.ok()) return st;
  // The size is known without the data: no synchronisation (the copy to the host, on the same
  // stream, waits for the kernel).
  return DeviceBytes{payload, static_cast<size_t>(bytes)};
}

absl::Status BitDpDecode(const uint8_t* payload, int64_t rows, int64_t cols, int bits, float* out,
                         Stream s) {
  if (absl::Status st = CheckShape(rows, cols, bits); !st.ok()) return st;
  const int64_t total = rows * cols;
  if (total == 0) return absl::OkStatus();
  // Grid-stride: enough blocks to fill any GPU, no grid-size limit to reach.
  const int64_t blocks = std::min<int64_t>(CeilDiv(total, kThreads), int64_t{1} << 16);
  BitDpDecodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(s)>>>(
      payload, rows, cols, bits, (cols + 7) / 8, out);
  return CudaStatus(cudaGetLastError(), "bitdp decode launch");
}

}  // namespace longhaul::codec::gpu
