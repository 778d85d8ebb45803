// The codecs on a CUDA device: the same payloads as the CPU engines (group_quant.h, sym_quant.h,
// bitdp.h), computed where the tensor lives so that only compressed bytes cross PCIe.
//
// The frame is the contract: for the same input (and, for stochastic rounding, the same seed) a
// payload encoded here is byte-identical to the CPU scalar reference's, and decoding here gives
// bit-identical floats (tests/codec/gpu_group_quant_test.cc and gpu_replica_codecs_test.cc check
// every codec over odd shapes). The
// per-element arithmetic is shared source (LONGHAUL_HD helpers in minifloat.h, int_util.h,
// cpu/kernels_common.h; the grouped encoder's per-group steps in cuda/group_quant_group.h, which a
// host test runs against the CPU reference in CI) and the kernels are compiled with --fmad=false
// (the one fused multiply-add, FastLog2's, is explicit on both sides); reductions follow the orders
// the CPU reference defines (32 lanes, lane j taking the elements i = j mod 32, combined pairwise:
// lane i += lane i + h for h = 16, 8, 4, 2, 1, which a warp computes with shuffles; a token's sums
// in 2048 lanes combined by stride doubling, codec/cpu/kernels_common.h).
//
// This header needs no CUDA headers: streams are passed as `Stream` (a cudaStream_t, or nullptr
// for the legacy default stream). Without the CUDA kernels in the build (LONGHAUL_CODEC_CUDA
// undefined), Available() is false and every call returns FailedPrecondition.
//
//   gpu::Workspace ws;                                   // one per thread that encodes
//   absl::StatusOr<gpu::DeviceBytes> p =
//       gpu::GroupQuantEncode(x_dev, FrameDtype::kBFloat16, tokens, dim, params, ws, stream, &stats);
//   std::string payload;  gpu::AppendToHost(*p, stream, &payload);   // == the CPU's payload
//
// Threading: a Workspace is used by one thread at a time; functions on different workspaces may
// run concurrently. GroupQuantEncode waits for its payload's size (which depends on the data: for
// tahquant the allocation's, while the encode kernel still runs; for int<k> the whole encode); the
// encoders and the decoders are otherwise asynchronous on the stream (AppendToHost and Download wait
// for them). So the caller keeps an input unchanged, and uses the workspace on another stream
// only, after the stream's work so far is done (the codec glue's AppendToHost waits for it).
#ifndef LONGHAUL_CODEC_CUDA_GPU_CODEC_H_
#define LONGHAUL_CODEC_CUDA_GPU_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/bitdp.h"
#include "codec/frame.h"
#include "codec/group_quant.h"
#include "codec/sym_quant.h"

namespace longhaul::codec::gpu {

using Stream = void*;  // cudaStream_t

// Whether the build has the kernels and a CUDA device is visible; `why` (optional) says why not.
bool Available(std::string* why = nullptr);

// Device memory owned by the caller (tests, benchmarks). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Scratch device memory the codecs reuse from call to call (grown, never shrunk), and a small
// pinned area the group-quant encoder reads its results through. Belongs to the device that was
// current when it first allocated.
class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Device scratch area number `slot` (0..kSlots-1) of at least `bytes`; its contents survive
  // until the next call with the same slot and a larger size.
  static constexpr int kSlots = 8;
  absl::StatusOr<void*> Scratch(int slot, size_t bytes);
  // The same area for a caller that leaves it all zeros when its work on `s` ends (its kernels
  // clear what they wrote): zeroed on `s` here only when that is not known to hold, that is, the
  // first time, after Scratch used the slot, after it grew, and after MarkDirty. The caller calls
  // MarkDirty(slot) when its work may end without clearing (a launch failed half-way).
  absl::StatusOr<void*> ZeroedScratch(int slot, size_t bytes, Stream s);
  void MarkDirty(int slot);
  // A small pinned host area (kPinnedBytes) for results the host reads back (after a
  // synchronisation, or once a number written after them has arrived: NextPinnedSeq), and its
  // address for the device's kernels to write.
  static constexpr size_t kPinnedBytes = 256;
  absl::StatusOr<void*> Pinned();  // zeroed when first allocated
  absl::StatusOr<void*> PinnedOnDevice();
  // A new number (1, 2, ...) for each call whose kernels announce their results in the pinned
  // area: written after the results, it tells this call's from an earlier call's.
  unsigned long long NextPinnedSeq() { return ++pinned_seq_; }
  // Copies n bytes of host memory to dst_dev on `s` and returns without waiting for the copy or
  // for earlier work on `s` (as a copy from pageable memory would): the bytes go through this
  // workspace's pinned staging buffer, which the next call reuses once this copy has read it.
  absl::Status UploadAsync(void* dst_dev, const void* src_host, size_t n, Stream s);

 private:
  absl::StatusOr<void*> Grow(int slot, size_t bytes);
  void* scratch_[kSlots] = {};
  size_t scratch_size_[kSlots] = {};
  bool zeroed_[kSlots] = {};  // the slot is all zeros once the work queued so far ends (ZeroedScratch)
  void* pinned_ = nullptr;
  void* pinned_dev_ = nullptr;
  unsigned long long pinned_seq_ = 0;
  void* staging_ = nullptr;
  size_t staging_size_ = 0;
  void* staging_read_ = nullptr;  // cudaEvent_t: the last copy out of staging_ is done
};

// A payload in device memory (inside a Workspace: valid until that workspace's next encode; its
// bytes are complete in the order of the encode's stream, AppendToHost and Download wait for them).
struct DeviceBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// --- copies and timing helpers (tests, benchmarks, the torch glue) ---
absl::Status Upload(void* dst_dev, const void* src_host, size_t n, Stream s);      // synchronous
absl::Status Download(void* dst_host, const void* src_dev, size_t n, Stream s);    // synchronous
absl::Status CopyOnDevice(void* dst_dev, const void* src_dev, size_t n, Stream s); // asynchronous
absl::Status Synchronize(Stream s);
// Appends the payload's bytes to *out (synchronous).
absl::Status AppendToHost(const DeviceBytes& payload, Stream s, std::string* out);

// --- encoders: input fp32, fp16 or bf16 in device memory (dtype), contiguous ---
// Grouped asymmetric quantisation (int<k>, tahquant): x is [tokens, dim]. Errors as the CPU's
// (NaN/Inf or |x| > 2^100 name the first such token).
absl::StatusOr<DeviceBytes> GroupQuantEncode(const void* x, FrameDtype dtype, int64_t tokens,
                                             int64_t dim, const GroupQuantParams& p, Workspace& ws,
                                             Stream s, GroupQuantStats* stats = nullptr);
// Symmetric group quantisation (sdp4bit-*, zeropp-*): x is n elements; element i draws its
// stochastic-rounding number from (seed, index_offset + i) as SymQuantEncode does.
absl::StatusOr<DeviceBytes> SymQuantEncode(const void* x, FrameDtype dtype, int64_t n,
                                           const SymQuantParams& p, uint64_t seed, Workspace& ws,
                                           Stream s, int64_t index_offset = 0);
// BitDP 1-/2-bit: x is [rows, cols].
absl::StatusOr<DeviceBytes> BitDpEncode(const void* x, FrameDtype dtype, int64_t rows, int64_t cols,
                                        int bits, Workspace& ws, Stream s);

// --- decoders: payload in device memory, already validated on the host (GroupQuantValidate,
// SymQuantValidate, BitDpValidate); output fp32 in device memory ---
absl::Status GroupQuantDecode(const uint8_t* payload, const GroupQuantLayout& layout, int64_t tokens,
                              int64_t dim, const GroupQuantParams& p, float* out, Workspace& ws,
                              Stream s);
absl::Status SymQuantDecode(const uint8_t* payload, int64_t n, const SymQuantParams& p, float* out,
                            Stream s);
absl::Status BitDpDecode(const uint8_t* payload, int64_t rows, int64_t cols, int bits, float* out,
                         Stream s);

}  // namespace longhaul::codec::gpu

#endif  // LONGHAUL_CODEC_CUDA_GPU_CODEC_H_
