// Inner loops of the grouped quantisers, as a table of function pointers with one scalar reference
// and one AVX2 implementation chosen at run time. Every AVX2 entry is bit-identical to the scalar
// one (tests/codec/kernels_test.cc), and so are the CUDA kernels (codec/cuda/): sums are accumulated
// in 32 lanes, lane j taking the elements i = j mod 32 in order, and the lanes are combined pairwise
// (ReduceLanes32 in kernels_common.h) in every backend; the grouped encoder's token sums in 2048
// lanes (ReduceLanesAscending), so a GPU block can add a token's elements in parallel.
//
//   const Kernels& k = BestKernels();     // AVX2 when the CPU has it; LONGHAUL_KERNELS=scalar forces
//   k.quantize(v, 64, lo, 1 / scale, 15.f, codes);
#ifndef LONGHAUL_CODEC_CPU_KERNELS_H_
#define LONGHAUL_CODEC_CPU_KERNELS_H_

#include <cstdint>

namespace longhaul::codec {

struct TokenSums {
  float sum = 0.0f, max = 0.0f, alog = 0.0f;
};

struct Kernels {
  const char* name;
  // sum and max of |x_i|.
  void (*abs_sum_max)(const float* x, int64_t n, float* sum, float* max);
  // A token's statistics for the grouped encoder: sum and max of |x_i|, and with `with_alog` the
  // sum of |x_i| * FastLog2(|x_i|) (each term added by a fused multiply-add; its entropy then
  // comes from TokenEntropy), both sums in kTokenLanes lanes (kernels_common.h).
  void (*token_sums)(const float* x, int64_t n, bool with_alog, TokenSums* out);
  // The two largest |g_i| (a1 >= a2, a2 == a1 when the maximum repeats).
  void (*top2_abs)(const float* g, int n, float* a1, float* a2);
  void (*min_max)(const float* v, int n, float* lo, float* hi);
  // In-place orthonormal Walsh-Hadamard transform (Sylvester order); n a power of two.
  void (*fwht)(float* v, int n);
  // q_i = clamp(round_half_even((v_i - lo) * inv_scale), 0, maxq).
  void (*quantize)(const float* v, int n, float lo, float inv_scale, float maxq, uint8_t* q);
  // out_i = float(q_i) * scale + lo (a multiply then an add, never fused).
  void (*dequantize)(const uint8_t* q, int n, float lo, float scale, float* out);
  // Bit packing, `bits` in 1..8: each run of 8 codes becomes `bits` bytes (code i at bit i*bits,
  // little-endian); a final partial run takes ceil(rem*bits/8) bytes.
  void (*pack)(const uint8_t* q, int64_t n, int bits, uint8_t* out);
  void (*unpack)(const uint8_t* in, int64_t n, int bits, uint8_t* q);
};

inline int64_t PackedBytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

const Kernels& ScalarKernels();
// nullptr when this CPU (or build) has no AVX2.
const Kernels* Avx2Kernels();
// The fastest available; the environment variable LONGHAUL_KERNELS=scalar forces the reference.
const Kernels& BestKernels();

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_CPU_KERNELS_H_
