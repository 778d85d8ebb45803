// A short convergence check of every codec's step: multi-output least squares (a 16 x 64 weight
// matrix and a bias) trained data-parallel by 4 ranks in 2 regions with Adam for 300 steps, each
// rank on its own data. The loss must fall for every codec, SDP4Bit must end within 1% of fp32, and
// the replicas' weights must be bit-identical at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "collective/data_parallel.h"
#include "tests/collective/harness.h"

namespace longhaul::collective {
namespace {

using testing::Cluster;
using testing::Kind;

constexpr int kOut = 16, kIn = 64, kSamples = 256, kBatch = 32, kSteps = 300;
constexpr int64_t kParams = kOut * kIn + kOut;

struct Problem {
  // Per rank: inputs [kSamples][kIn] and targets [kSamples][kOut].
  std::vector<std::vector<float>> x, y;
  explicit Problem(int ranks) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(kOut * kIn), b(kOut);
    for (float& v : w) v = normal(rng) * 0.5f;
    for (float& v : b) v = normal(rng);
    x.resize(ranks);
    y.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (int s = 0; s < kSamples; ++s) {
        std::vector<float> xs(kIn);
        for (float& v : xs) v = normal(rng);
        x[r].insert(x[r].end(), xs.begin(), xs.end());
        for (int o = 0; o < kOut; ++o) {
          float t = b[o] + 0.1f * normal(rng);
          for (int i = 0; i < kIn; ++i) t += w[o * kIn + i] * xs[i];
          y[r].push_back(t);
        }
      }
    }
  }

  // 0.5 * mean over samples of the squared error (summed over outputs); adds the gradient of the
  // mean over `samples` to *grad when given.
  double Loss(const std::vector<float>& p, int r, const std::vector<int>& samples, std::vector<float>* grad) const {
    double loss = 0;
    const float inv = 1.0f / static_cast<float>(samples.size());
    for (int s : samples) {
      const float* xs = &x[r][s * kIn];
      for (int o = 0; o < kOut; ++o) {
        float e = p[kOut * kIn + o] - y[r][s * kOut + o];
        for (int i = 0; i < kIn; ++i) e += p[o * kIn + i] * xs[i];
        loss += 0.5 * e * e;
        if (grad) {
          for (int i = 0; i < kIn; ++i) (*grad)[o * kIn + i] += e * xs[i] * inv;
          (*grad)[kOut * kIn + o] += e * inv;
        }
      }
    }
    return loss / static_cast<double>(samples.size());
  }
};

// Adam on the range a rank owns.
struct ShardAdam {
  std::vector<float> m, v;
  int t = 0;
  void Update(absl::Span<const float> grad_sum, int replicas, float lr, absl::Span<float> main) {
    if (m.empty()) m.assign(main.size(), 0.0f), v.assign(main.size(), 0.0f);
    ++t;
    const float b1 = 0.9f, b2 = 0.999f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)), c2 = 1.0f - std::pow(b2, static_cast<float>(t));
    for (size_t i = 0; i < main.size(); ++i) {
      const float g = grad_sum[i] / static_cast<float>(replicas);
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      main[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
    }
  }
};

struct Outcome {
  double initial = 0, final = 0;
  bool identical = true;
  CallStats stats;
};

Outcome Train(DpCodec codec) {
  Cluster c(Kind::kInProcess, {"a", "a", "b", "b"});
  const int P = c.size();
  const Problem problem(P);
  std::vector<std::vector<float>> params(P, std::vector<float>(kParams, 0.0f));
  std::vector<int> all(kSamples);
  for (int s = 0; s < kSamples; ++s) all[s] = s;
  auto global_loss = [&](const std::vector<float>& p) {
    double l = 0;
    for (int r = 0; r < P; ++r) l += problem.Loss(p, r, all, nullptr);
    return l / P;
  };
  Outcome out;
  out.initial = global_loss(params[0]);
  std::vector<absl::Status> status(P);
  c.Run([&](int r) {
    DpOptions o = DefaultDpOptions(codec);
    o.bitdp_layout = {{kOut, kIn, true}, {1, kOut, false}};
    auto dp = DataParallelSync::Create(&c.group(r), kParams, o);
    if (!dp.ok()) {
      status[r] = dp.status();
      return;
    }
    ShardAdam adam;
    std::mt19937 rng(1000 + r);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int> batch(kBatch);
      for (int& s : batch) s = static_cast<int>(rng() % kSamples);
      std::vector<float> grad(kParams, 0.0f);
      problem.Loss(params[r], r, batch, &grad);
      // Cosine decay from 0.02 to 0.002.
      const float lr = 0.002f + 0.018f * 0.5f * (1.0f + std::cos(3.14159265f * step / kSteps));
      absl::StatusOr<CallStats> s =
          (*dp)->Step(grad, absl::MakeSpan(params[r]), [&](int64_t, absl::Span<const float> g, absl::Span<float> main) {
            adam.Update(g, P, lr, main);
          });
      if (!s.ok()) {
        status[r] = s.status();
        return;
      }
      if (r == 0) out.stats.Add(*s);
    }
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_TRUE(status[r].ok()) << status[r];
    if (std::memcmp(params[r].data(), params[0].data(), kParams * sizeof(float)) != 0) out.identical = false;
  }
  out.final = global_loss(params[0]);
  return out;
}

TEST(ConvergenceTest, EveryCodecTrainsAndSdp4BitStaysWithinOnePercentOfFp32) {
  std::map<DpCodec, Outcome> res;
  for (DpCodec codec : {DpCodec::kFp32, DpCodec::kSdp4Bit, DpCodec::kZeroPP, DpCodec::kBitDp1, DpCodec::kBitDp2}) {
    res[codec] = Train(codec);
    const Outcome& o = res[codec];
    std::printf("%-8s loss %.4f -> %.4f, bytes sent by rank 0 %lld (x%.2f vs fp32 contents), identical %d\n",
                DpCodecName(codec), o.initial, o.final, static_cast<long long>(o.stats.bytes_sent),
                o.stats.compression(), o.identical);
    EXPECT_TRUE(o.identical) << DpCodecName(codec);
    EXPECT_LT(o.final, 0.1 * o.initial) << DpCodecName(codec);
  }
  const double fp32 = res[DpCodec::kFp32].final;
  EXPECT_LT(std::abs(res[DpCodec::kSdp4Bit].final - fp32) / fp32, 0.01)
      << "sdp4bit " << res[DpCodec::kSdp4Bit].final << " fp32 " << fp32;
}

}  // namespace
}  // namespace longhaul::collective
