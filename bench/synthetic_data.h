// Deterministic synthetic tensors for codec tests and benchmarks (no data sets can be downloaded
// here, and real activations come later from the stage runtime).
//
// LLM-like activations, [tokens, hidden]:
//   - token energy e_t = exp(energy_sigma * z_t): tokens differ in scale (log-normal);
//   - each token puts a share c_t ~ U[outlier_share_min, outlier_share_max] of its energy into
//     `outlier_channels` fixed channels (chosen by seed, consistent sign s_c per channel, as observed
//     in LLM hidden states) and the rest into a Gaussian body:
//       body    x_ti = e_t * sqrt(1 - c_t) * z_ti
//       outlier x_tc = e_t * sqrt(c_t * hidden / outlier_channels) * s_c * (1 + 0.1 z)
//     so tokens differ in how concentrated they are (their entropy), at comparable energy.
//     outlier_share_min == outlier_share_max gives every token the same structure.
//   - a fraction `spiky_token_fraction` of tokens also gets one random channel at 50x its energy
//     (low-entropy tokens).
// All randomness is a SplitMix64 stream + Box-Muller, identical on every platform.
#ifndef LONGHAUL_BENCH_SYNTHETIC_DATA_H_
#define LONGHAUL_BENCH_SYNTHETIC_DATA_H_

#include <cstdint>
#include <vector>

namespace longhaul::bench {

struct ActivationSpec {
  int64_t tokens = 1024;
  int64_t hidden = 1024;
  uint64_t seed = 1;
  int outlier_channels = 4;  // "a few": LLM.int8() reports ~6 per 4096 channels
  float outlier_share_min = 0.3f;
  float outlier_share_max = 0.9f;
  float energy_sigma = 0.5f;
  float spiky_token_fraction = 0.05f;
};

std::vector<float> SyntheticActivations(const ActivationSpec& spec);

// Heavy-tailed gradients, [rows, cols] (rows = output channels): entry = r_i * t_ij with a per-row
// log-normal scale r_i = exp(0.5 z_i) and t Student-t with 3 degrees of freedom (finite variance,
// heavy tails, as weight gradients of transformers are); `outlier_cols` columns are 20x larger.
std::vector<float> SyntheticGradients(int64_t rows, int64_t cols, uint64_t seed, int outlier_cols = 4);

// Deterministic standard normal stream.
class Normal {
 public:
  explicit Normal(uint64_t seed) : state_(seed) {}
  float Next();
  uint64_t NextU64();

 private:
  uint64_t state_;
  bool have_spare_ = false;
  float spare_ = 0.0f;
};

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_SYNTHETIC_DATA_H_
