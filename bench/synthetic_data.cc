#include "bench/synthetic_data.h"

#include <cmath>

namespace longhaul::bench {

uint64_t Normal::NextU64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float Normal::Next() {
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  // Uniforms in (0, 1]: 53 random bits.
  const double u1 = (static_cast<double>(NextU64() >> 11) + 1.0) * 0x1p-53;
  const double u2 = static_cast<double>(NextU64() >> 11) * 0x1p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  have_spare_ = true;
  return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
}

std::vector<float> SyntheticActivations(const ActivationSpec& s) {
  Normal rng(s.seed);
  std::vector<int64_t> out_ch(s.outlier_channels);
  std::vector<float> out_sign(s.outlier_channels);
  for (int c = 0; c < s.outlier_channels; ++c) {
    out_ch[c] = static_cast<int64_t>(rng.NextU64() % static_cast<uint64_t>(s.hidden));
    out_sign[c] = (rng.NextU64() & 1) ? 1.0f : -1.0f;
  }
  std::vector<float> x(static_cast<size_t>(s.tokens * s.hidden));
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* row = x.data() + t * s.hidden;
    const float e = std::exp(s.energy_sigma * rng.Next());
    const double u_share = static_cast<double>(rng.NextU64() >> 11) * 0x1p-53;
    const float share = s.outlier_channels > 0
        ? static_cast<float>(s.outlier_share_min + (s.outlier_share_max - s.outlier_share_min) * u_share)
        : 0.0f;
    const float body = e * std::sqrt(1.0f - share);
    const float outlier = s.outlier_channels > 0
        ? e * std::sqrt(share * static_cast<float>(s.hidden) / static_cast<float>(s.outlier_channels))
        : 0.0f;
    for (int64_t i = 0; i < s.hidden; ++i) row[i] = body * rng.Next();
    for (int c = 0; c < s.outlier_channels; ++c) {
      row[out_ch[c]] = outlier * out_sign[c] * (1.0f + 0.1f * rng.Next());
    }
    const double u = static_cast<double>(rng.NextU64() >> 11) * 0x1p-53;
    if (u < s.spiky_token_fraction) {
      row[rng.NextU64() % static_cast<uint64_t>(s.hidden)] = 50.0f * e;
    }
  }
  return x;
}

std::vector<float> SyntheticGradients(int64_t rows, int64_t cols, uint64_t seed, int outlier_cols) {
  Normal n(seed * 0x9e3779b97f4a7c15ull + 7);
  std::vector<bool> outlier(static_cast<size_t>(cols), false);
  for (int k = 0; k < outlier_cols && cols > 0; ++k) outlier[n.NextU64() % cols] = true;
  std::vector<float> g(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float r = std::exp(0.5f * n.Next());
    for (int64_t j = 0; j < cols; ++j) {
      const float a = n.Next(), b = n.Next(), c = n.Next();
      const float t = n.Next() / std::sqrt((a * a + b * b + c * c) / 3.0f + 1e-12f);
      g[i * cols + j] = r * t * (outlier[j] ? 20.0f : 1.0f);
    }
  }
  return g;
}

}  // namespace longhaul::bench
