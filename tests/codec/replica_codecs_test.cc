// SDP4Bit (qWD, TLq-HS), ZeRO++ (ULq/qgZ, qW) and BitDP: the properties the papers rely on.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "bench/synthetic_data.h"
#include "codec/bitdp.h"
#include "codec/codec.h"
#include "codec/sdp4bit.h"
#include "codec/sym_quant.h"

namespace longhaul::codec {
namespace {

double RelL2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> Gaussian(int64_t n, uint64_t seed, float scale = 1.0f) {
  bench::Normal z(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * z.Next();
  return v;
}

std::vector<float> RoundTrip(const std::vector<float>& x, const SymQuantParams& p, uint64_t seed = 0) {
  std::string payload;
  SymQuantEncode(x.data(), static_cast<int64_t>(x.size()), p, seed, &payload);
  EXPECT_TRUE(SymQuantValidate(payload, static_cast<int64_t>(x.size()), p).ok());
  std::vector<float> y(x.size());
  SymQuantDecode(payload, static_cast<int64_t>(x.size()), p, {}, y.data());
  return y;
}

// ------------------------------------------------------------------------------ sym_quant

TEST(SymQuantTest, HadamardIsOrthonormalAndItsOwnInverse) {
  std::vector<float> x = Gaussian(32 * 5 + 7, 1);  // with a tail that stays untouched
  std::vector<float> y = x;
  Hadamard32(y.data(), static_cast<int64_t>(y.size()));
  double nx = 0, ny = 0;
  for (size_t i = 0; i < 160; ++i) {
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
  for (size_t i = 160; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]);
  Hadamard32(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-5);
}

TEST(SymQuantTest, FusedHadamardMatchesTheUnfusedReference) {
  // Encoding with the fused transform must give exactly the bytes of transform-then-encode.
  std::vector<float> x = bench::SyntheticGradients(8, 1000, 3);
  const int64_t n = static_cast<int64_t>(x.size());
  SymQuantParams fused{4, 128, true, Rounding::kNearest};
  SymQuantParams plain{4, 128, false, Rounding::kNearest};
  std::string a, b;
  SymQuantEncode(x.data(), n, fused, 0, &a);
  std::vector<float> t = x;
  Hadamard32(t.data(), n);
  SymQuantEncode(t.data(), n, plain, 0, &b);
  EXPECT_EQ(a, b);
  // Decoding: fused inverse == decode in the Hadamard domain, then the reference transform.
  std::vector<float> d1(x.size()), d2(x.size());
  SymQuantDecode(a, n, fused, {}, d1.data());
  SymQuantDecode(a, n, fused, {false, true}, d2.data());
  Hadamard32(d2.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(d1[i], d2[i]);
}

TEST(SymQuantTest, Avx2MatchesTheScalarReferenceByteForByte) {
  const Kernels* avx2 = Avx2Kernels();
  if (avx2 == nullptr) GTEST_SKIP() << "this CPU has no AVX2";
  std::vector<float> x = bench::SyntheticGradients(16, 1000, 21);
  x[5] = std::nanf("");
  const int64_t n = static_cast<int64_t>(x.size()) - 3;  // a partial last group and a sub-32 tail
  for (int bits : {2, 3, 4, 5, 8}) {
    for (bool hadamard : {false, true}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
        SymQuantParams p{bits, 128, hadamard, r};
        std::string a, b;
        SymQuantEncode(x.data(), n, p, 9, &a, 0, ScalarKernels());
        SymQuantEncode(x.data(), n, p, 9, &b, 0, *avx2);
        ASSERT_EQ(a, b) << "bits " << bits << " hadamard " << hadamard;
        ASSERT_TRUE(SymQuantValidate(a, n, p, ScalarKernels()).ok());
        ASSERT_TRUE(SymQuantValidate(a, n, p, *avx2).ok());
        std::vector<float> ya(n, 1.0f), yb(n, 1.0f);
        SymQuantDecode(a, n, p, {true, false}, ya.data(), ScalarKernels());
        SymQuantDecode(a, n, p, {true, false}, yb.data(), *avx2);
        ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), n * sizeof(float))) << "bits " << bits;
      }
    }
  }
}

TEST(SymQuantTest, ErrorIsBoundedByHalfAStepPerGroup) {
  for (int bits : {2, 4, 8}) {
    SymQuantParams p{bits, 64, false, Rounding::kNearest};
    std::vector<float> x = Gaussian(1000, bits);
    std::vector<float> y = RoundTrip(x, p);
    const int qmax = (1 << (bits - 1)) - 1;
    for (int64_t g = 0; g * 64 < 1000; ++g) {
      float s = 0;
      for (int64_t i = g * 64; i < std::min<int64_t>(1000, (g + 1) * 64); ++i) s = std::max(s, std::fabs(x[i]));
      for (int64_t i = g * 64; i < std::min<int64_t>(1000, (g + 1) * 64); ++i) {
        EXPECT_LE(std::fabs(x[i] - y[i]), 0.5f * s / qmax * 1.0001f) << "bits " << bits << " i " << i;
      }
    }
  }
}

TEST(SymQuantTest, StochasticRoundingIsUnbiased) {
  // Mean over many independent draws converges to x; nearest rounding keeps a fixed bias.
  const int64_t n = 2048;
  const int trials = 2000;
  std::vector<float> x = Gaussian(n, 5);
  SymQuantParams sr{4, 128, true, Rounding::kStochastic};
  SymQuantParams nr{4, 128, true, Rounding::kNearest};
  std::vector<double> mean_sr(n, 0.0);
  for (int t = 0; t < trials; ++t) {
    std::vector<float> y = RoundTrip(x, sr, /*seed=*/1000 + t);
    for (int64_t i = 0; i < n; ++i) mean_sr[i] += (double(y[i]) - x[i]) / trials;
  }
  std::vector<float> y_nr = RoundTrip(x, nr);
  // The quantisation step in the Hadamard domain is s/7 with s ~ 3.5 (max of 128 Gaussians), so a
  // single draw's error has standard deviation <= ~0.25 per element; the mean of 2000 draws,
  // mapped back through the orthonormal transform, <= ~0.006. Tolerance: 5 sigma.
  double worst_sr = 0, overall_sr = 0, rms_nr = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst_sr = std::max(worst_sr, std::fabs(mean_sr[i]));
    overall_sr += mean_sr[i] / n;
    rms_nr += (double(y_nr[i]) - x[i]) * (double(y_nr[i]) - x[i]) / n;
  }
  EXPECT_LT(worst_sr, 0.03) << "largest per-element bias of stochastic rounding";
  EXPECT_LT(std::fabs(overall_sr), 0.002);
  EXPECT_GT(std::sqrt(rms_nr), 0.05) << "nearest rounding's fixed error, for contrast";
}

TEST(SymQuantTest, MalformedPayloadsAreRejected) {
  SymQuantParams p{4, 128, false, Rounding::kNearest};
  std::vector<float> x = Gaussian(300, 9);
  std::string good;
  SymQuantEncode(x.data(), 300, p, 0, &good);
  EXPECT_TRUE(SymQuantValidate(good, 300, p).ok());
  EXPECT_NE(SymQuantValidate(good.substr(1), 300, p).message().find("bytes"), std::string::npos);
  std::string nan_scale = good;
  const float nan = std::nanf("");
  std::memcpy(&nan_scale[4], &nan, 4);
  EXPECT_NE(SymQuantValidate(nan_scale, 300, p).message().find("scale"), std::string::npos);
  std::string bad_code = good;
  bad_code[3 * 4] = static_cast<char>(0xff);  // first code byte: two codes of 15 (> 2*7)
  EXPECT_NE(SymQuantValidate(bad_code, 300, p).message().find("out of range"), std::string::npos);
  // 300 * 4 bits = 150 bytes exactly: use an odd count to have padding.
  std::string odd;
  SymQuantEncode(x.data(), 301, p, 0, &odd);
  odd.back() = static_cast<char>(odd.back() | 0xf0);
  EXPECT_NE(SymQuantValidate(odd, 301, p).message().find("padding"), std::string::npos);
  std::array<uint8_t, 16> raw = p.Serialize();
  raw[9] = 1;
  EXPECT_FALSE(SymQuantParams::Parse(raw).ok());
  raw = SymQuantParams{4, 96, false, Rounding::kNearest}.Serialize();
  EXPECT_FALSE(SymQuantParams::Parse(raw).ok());
}

// A code of all ones (-2^(bits-1), never written) is found wherever it is, at every width: the
// widths that divide a byte are tested in place, 64 bits at a time, the others unpacked.
TEST(SymQuantTest, AnOutOfRangeCodeIsFoundAtEveryPositionAndWidth) {
  const int64_t n = 203;  // 4 groups of 64, the last one short; some widths leave padding bits
  std::vector<float> x = Gaussian(n, 5);
  for (int bits = 2; bits <= 8; ++bits) {
    SymQuantParams p{bits, 64, false, Rounding::kNearest};
    std::string good;
    SymQuantEncode(x.data(), n, p, 0, &good);
    ASSERT_TRUE(SymQuantValidate(good, n, p).ok()) << bits << " bits";
    const size_t codes = 4 * 4;  // after the 4 groups' scales
    for (int64_t e = 0; e < n; ++e) {
      std::string bad = good;
      for (int b = 0; b < bits; ++b) {  // element e's bits, least significant first
        const int64_t bit = e * bits + b;
        bad[codes + bit / 8] = static_cast<char>(bad[codes + bit / 8] | (1 << (bit % 8)));
      }
      const absl::Status s = SymQuantValidate(bad, n, p);
      EXPECT_NE(s.message().find(absl::StrCat("element ", e, " is out of range")), std::string::npos)
          << bits << " bits, element " << e << ": " << s;
    }
  }
}

TEST(SymQuantTest, CodecSpecsRoundTripThroughFrames) {
  torch::manual_seed(2);
  const torch::Tensor g = torch::randn({64, 256});
  for (const char* spec : {"sdp4bit-qwd", "sdp4bit-tlqhs", "sdp4bit-tlqhs:bits=8,rounding=stochastic", "zeropp-ulq",
                           "zeropp-qw:bits=8,g=256", "bitdp1", "bitdp2"}) {
    auto c = MakeCodec(spec);
    ASSERT_TRUE(c.ok()) << spec << ": " << c.status();
    auto again = MakeCodec((*c)->spec());
    ASSERT_TRUE(again.ok()) << (*c)->spec();
    EXPECT_EQ((*again)->spec(), (*c)->spec());
    auto f = (*c)->Encode(g);
    ASSERT_TRUE(f.ok()) << spec;
    auto y = DecodeFrame(*f);
    ASSERT_TRUE(y.ok()) << spec << ": " << y.status();
    EXPECT_EQ(y->sizes(), g.sizes());
    const double err = ((g - *y).norm() / g.norm()).item<double>();
    EXPECT_LT(err, std::string(spec).rfind("bitdp", 0) == 0 ? 0.9 : 0.2) << spec;
  }
  EXPECT_FALSE(MakeCodec("sdp4bit-tlqhs:bits=3").ok());
  EXPECT_FALSE(MakeCodec("zeropp-ulq:rounding=stochastic").ok());
  EXPECT_FALSE(MakeCodec("bitdp3").ok());
  EXPECT_FALSE(MakeCodec("sdp4bit-tlqhs:g=48").ok());
}

// ------------------------------------------------------------------------------------ qWD

// The paper's nearest-ternary quantiser: s = max |w|, q(w) = round(w / s) * s, round to {-1, 0, 1}.
std::vector<float> Ternary(const std::vector<float>& w) {
  float s = 0;
  for (float v : w) s = std::max(s, std::fabs(v));
  std::vector<float> q(w.size(), 0.0f);
  if (s == 0) return q;
  for (size_t i = 0; i < w.size(); ++i) q[i] = std::max(-1.0f, std::min(1.0f, std::nearbyint(w[i] / s))) * s;
  return q;
}

TEST(QwdTest, Counterexample41WeightQuantisationStallsWeightDifferencesConverge) {
  // f(w) = ||w||^2, g(w) = (4 w1, 0) or (0, 4 w2) with probability 1/2, w0 = (1, -1), eta < 0.125.
  const float eta = 0.1f;
  std::mt19937 rng(7);
  std::bernoulli_distribution coin(0.5);
  // qW: the weights themselves are compressed, SGD continues from the compressed weights.
  std::vector<float> w_qw = {1, -1}, model_qw = {1, -1};
  // qWD: fp32 main weights, compressed model = model + C(main - model).
  std::vector<float> main = {1, -1}, model = {1, -1};
  // No compression, for reference.
  std::vector<float> plain = {1, -1};
  for (int t = 0; t < 500; ++t) {
    const bool first = coin(rng);
    auto grad = [&](const std::vector<float>& w) {
      return first ? std::vector<float>{4 * w[0], 0} : std::vector<float>{0, 4 * w[1]};
    };
    const std::vector<float> gq = grad(model_qw);
    for (int i = 0; i < 2; ++i) w_qw[i] = model_qw[i] - eta * gq[i];
    ApplyWeightQuantisation(w_qw, &model_qw, Ternary);
    const std::vector<float> gd = grad(model);
    for (int i = 0; i < 2; ++i) main[i] -= eta * gd[i];
    ApplyWeightDifference(main, &model, Ternary);
    const std::vector<float> gp = grad(plain);
    for (int i = 0; i < 2; ++i) plain[i] -= eta * gp[i];
  }
  EXPECT_EQ(model_qw, (std::vector<float>{1, -1})) << "qW should be stuck at the initial value";
  EXPECT_LT(std::hypot(model[0], model[1]), 1e-3) << "qWD should converge to (0, 0)";
  EXPECT_LT(std::hypot(plain[0], plain[1]), 1e-3);
}

TEST(QwdTest, ReplicasStayBitIdenticalAndTheErrorDoesNotAccumulate) {
  // R replicas, each owning a shard of the main weights; every step each owner all-gathers its
  // quantised difference and every replica applies all of them to its own model copy.
  const int R = 4;
  const int64_t shard = 5000, n = R * shard;
  std::vector<float> main = Gaussian(n, 11, 0.05f);
  std::vector<std::vector<float>> model(R, main);
  bench::Normal noise(12);
  double err_early = 0, err_late = 0;
  for (int step = 1; step <= 300; ++step) {
    for (float& w : main) w += 1e-3f * noise.Next();  // an optimizer step
    std::vector<std::string> gathered(R);
    for (int r = 0; r < R; ++r) {
      gathered[r] = QwdEncodeShard(main.data() + r * shard, model[r].data() + r * shard, shard);
    }
    for (int r = 0; r < R; ++r) {
      for (int owner = 0; owner < R; ++owner) {
        ASSERT_TRUE(QwdApplyShard(gathered[owner], shard, model[r].data() + owner * shard).ok());
      }
    }
    for (int r = 1; r < R; ++r) {
      ASSERT_EQ(std::memcmp(model[r].data(), model[0].data(), n * sizeof(float)), 0) << "step " << step;
    }
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; ++i) {
      e += (double(main[i]) - model[0][i]) * (double(main[i]) - model[0][i]);
      m += double(main[i]) * main[i];
    }
    if (step == 50) err_early = std::sqrt(e / m);
    if (step == 300) err_late = std::sqrt(e / m);
  }
  EXPECT_GT(err_early, 0.0);
  EXPECT_LT(err_late, 2.0 * err_early) << "model-vs-main error grew from " << err_early << " to " << err_late;
  EXPECT_LT(err_late, 0.05);
}

// -------------------------------------------------------------------------------- two-level

std::vector<std::vector<float>> ReplicaGradients(int P, int64_t n, uint64_t seed) {
  std::vector<std::vector<float>> g;
  for (int p = 0; p < P; ++p) g.push_back(bench::SyntheticGradients(16, n / 16, seed + p));
  return g;
}

std::vector<float> ExactSum(const std::vector<std::vector<float>>& g) {
  std::vector<float> s(g[0].size(), 0.0f);
  for (const auto& v : g) {
    for (size_t i = 0; i < s.size(); ++i) s[i] += v[i];
  }
  return s;
}

TEST(TwoLevelTest, TlqHsBeatsUlqAndTlqOnHeavyTailedGradients) {
  const auto g = ReplicaGradients(8, 16 * 4096, 100);
  const std::vector<float> exact = ExactSum(g);
  auto run = [&](const TwoLevelConfig& c) {
    auto r = SimulateTwoLevelReduce(g, /*regions=*/2, c, 1);
    EXPECT_TRUE(r.ok()) << r.status();
    return RelL2(exact, *r);
  };
  const double tlqhs = run(TlqHs()), tlq = run(Tlq()), ulq = run(Ulq());
  EXPECT_LT(tlqhs, tlq) << "TLq-HS " << tlqhs << " vs TLq " << tlq;
  EXPECT_LT(tlq, ulq) << "TLq " << tlq << " vs ULq " << ulq;
  EXPECT_LT(tlqhs, 0.8 * ulq) << "TLq-HS " << tlqhs << " vs ULq " << ulq;
  RecordProperty("tlqhs", std::to_string(tlqhs));
  RecordProperty("tlq", std::to_string(tlq));
  RecordProperty("ulq", std::to_string(ulq));
}

TEST(TwoLevelTest, StochasticTwoLevelReduceIsUnbiased) {
  const auto g = ReplicaGradients(4, 16 * 256, 200);
  const std::vector<float> exact = ExactSum(g);
  std::vector<double> mean(exact.size(), 0.0);
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    auto r = SimulateTwoLevelReduce(g, 2, TlqHs(Rounding::kStochastic), 5000 + t);
    ASSERT_TRUE(r.ok());
    for (size_t i = 0; i < exact.size(); ++i) mean[i] += (double((*r)[i]) - exact[i]) / trials;
  }
  const double single = RelL2(exact, *SimulateTwoLevelReduce(g, 2, TlqHs(Rounding::kStochastic), 1));
  std::vector<float> meanv(exact.size());
  for (size_t i = 0; i < exact.size(); ++i) meanv[i] = static_cast<float>(exact[i] + mean[i]);
  // Averaging 400 unbiased draws shrinks the error about 20x; a biased reduce would not shrink.
  EXPECT_LT(RelL2(exact, meanv), single / 8) << "single draw " << single;
}

TEST(TwoLevelTest, QgzSliceOrderGivesEachRankItsOwnShard) {
  EXPECT_EQ(QgzChunkOrder(2, 3), (std::vector<int>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(QgzChunkOrder(4, 1), (std::vector<int>{0, 1, 2, 3}));
  // Replica p holds the value 10 * (p + 1) + chunk everywhere in a chunk: constant groups survive
  // quantisation, so the reduced sum identifies the chunk each owner ended up with.
  const int P = 6, regions = 3;
  const int64_t chunk = 256, n = P * chunk;
  std::vector<std::vector<float>> g(P, std::vector<float>(n));
  for (int p = 0; p < P; ++p) {
    for (int64_t i = 0; i < n; ++i) g[p][i] = 10.0f * (p + 1) + static_cast<float>(i / chunk);
  }
  std::vector<int> owner;
  auto r = SimulateTwoLevelReduce(g, regions, Ulq(), 3, &owner);
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < n; ++i) {
    const float want = 10.0f * (P * (P + 1) / 2) + P * static_cast<float>(i / chunk);
    ASSERT_NEAR((*r)[i], want, 1e-3f * want) << "element " << i;
    ASSERT_EQ(owner[i], i / chunk);
  }
  EXPECT_FALSE(SimulateTwoLevelReduce(g, 4, Ulq(), 0).ok());  // 6 replicas, 4 regions
}

// ------------------------------------------------------------------------------------ BitDP

TEST(BitDpTest, ExactReductionEqualsTheDenseSumOfScaledCodes) {
  const int P = 5;
  const int64_t rows = 24, cols = 77;  // cols not a multiple of 8: padding bits in every row
  for (int bits : {1, 2}) {
    std::vector<std::string> payloads(P);
    std::vector<float> dense(rows * cols, 0.0f), one(rows * cols);
    for (int p = 0; p < P; ++p) {
      const std::vector<float> g = bench::SyntheticGradients(rows, cols, 40 + p);
      BitDpEncode(g.data(), rows, cols, bits, &payloads[p]);
      ASSERT_TRUE(BitDpValidate(payloads[p], rows, cols, bits).ok());
      BitDpDecode(payloads[p], rows, cols, bits, one.data());
      for (size_t i = 0; i < dense.size(); ++i) dense[i] += one[i];
    }
    std::vector<absl::string_view> views(payloads.begin(), payloads.end());
    std::vector<float> reduced(rows * cols);
    ASSERT_TRUE(BitDpReduce(views, rows, cols, bits, BitDpReduction::kExact, reduced.data()).ok());
    EXPECT_EQ(reduced, dense) << bits << "-bit";
    std::vector<float> approx(rows * cols);
    ASSERT_TRUE(BitDpReduce(views, rows, cols, bits, BitDpReduction::kApproximate, approx.data()).ok());
    EXPECT_GT(RelL2(dense, approx), 1e-3) << "different per-replica scales make the paper's form approximate";
  }
}

TEST(BitDpTest, ApproximateReductionIsExactWhenScalesAgree) {
  const int64_t rows = 4, cols = 16;
  std::vector<float> a(rows * cols), b(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    a[i] = (i % 3 == 0) ? 1.0f : -1.0f;
    b[i] = (i % 5 == 0) ? -1.0f : 1.0f;
  }
  std::string pa, pb;
  BitDpEncode(a.data(), rows, cols, 1, &pa);
  BitDpEncode(b.data(), rows, cols, 1, &pb);
  std::vector<float> exact(rows * cols), approx(rows * cols);
  ASSERT_TRUE(BitDpReduce({pa, pb}, rows, cols, 1, BitDpReduction::kExact, exact.data()).ok());
  ASSERT_TRUE(BitDpReduce({pa, pb}, rows, cols, 1, BitDpReduction::kApproximate, approx.data()).ok());
  EXPECT_EQ(exact, approx);
}

TEST(BitDpTest, TwoBitsAreMoreAccurateThanOne) {
  const int64_t rows = 64, cols = 512;
  const std::vector<float> g = bench::SyntheticGradients(rows, cols, 9);
  double err[3] = {0, 0, 0};
  for (int bits : {1, 2}) {
    std::string p;
    BitDpEncode(g.data(), rows, cols, bits, &p);
    std::vector<float> y(g.size());
    BitDpDecode(p, rows, cols, bits, y.data());
    err[bits] = RelL2(g, y);
  }
  EXPECT_LT(err[2], err[1]) << "2-bit " << err[2] << ", 1-bit " << err[1];
}

TEST(BitDpTest, ThreeQuartersOfTheMeanIsTheOptimalThresholdOnTriangularData) {
  // The paper's objective for the ternary threshold: maximise (sum_{|g| > a} |g|)^2 / |{|g| > a}|.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> g(400000);
  for (float& v : g) v = u(rng) + u(rng) - 1.0f;  // triangular on [-1, 1]
  double mean_abs = 0;
  for (float v : g) mean_abs += std::fabs(v) / g.size();
  std::vector<float> a(g.size());
  for (size_t i = 0; i < g.size(); ++i) a[i] = std::fabs(g[i]);
  std::sort(a.begin(), a.end());
  std::vector<double> suffix(a.size() + 1, 0.0);
  for (size_t i = a.size(); i-- > 0;) suffix[i] = suffix[i + 1] + a[i];
  auto objective = [&](double alpha) {
    const size_t k = std::upper_bound(a.begin(), a.end(), static_cast<float>(alpha)) - a.begin();
    const double cnt = static_cast<double>(a.size() - k);
    return cnt > 0 ? suffix[k] * suffix[k] / cnt : 0.0;
  };
  double best = 0, best_ratio = 0;
  for (double ratio = 0.0; ratio <= 2.5; ratio += 0.005) {
    const double j = objective(ratio * mean_abs);
    if (j > best) {
      best = j;
      best_ratio = ratio;
    }
  }
  EXPECT_NEAR(best_ratio, kBitDpAlpha, 0.02);
  EXPECT_GT(objective(kBitDpAlpha * mean_abs), 0.999 * best);
}

TEST(BitDpTest, MalformedPayloadsAreRejected) {
  const int64_t rows = 3, cols = 13;
  const std::vector<float> g = bench::SyntheticGradients(rows, cols, 1);
  std::string p;
  BitDpEncode(g.data(), rows, cols, 2, &p);
  ASSERT_TRUE(BitDpValidate(p, rows, cols, 2).ok());
  EXPECT_NE(BitDpValidate(p + "x", rows, cols, 2).message().find("bytes"), std::string::npos);
  EXPECT_NE(BitDpValidate(p, rows, cols, 3).message().find("not 1 or 2"), std::string::npos);
  std::string both = p;
  both[4 * rows] = static_cast<char>(0x01);      // row 0, +1 plane, entry 0
  both[4 * rows + 2] = static_cast<char>(0x01);  // row 0, -1 plane, entry 0 (plane = 2 bytes)
  EXPECT_NE(BitDpValidate(both, rows, cols, 2).message().find("both +1 and -1"), std::string::npos);
  std::string pad = p;
  pad[4 * rows + 1] = static_cast<char>(pad[4 * rows + 1] | 0x80);  // bit 15 of a 13-column plane
  EXPECT_NE(BitDpValidate(pad, rows, cols, 2).message().find("padding"), std::string::npos);
  std::string neg = p;
  const float minus = -1.0f;
  std::memcpy(&neg[0], &minus, 4);
  EXPECT_NE(BitDpValidate(neg, rows, cols, 2).message().find("scale"), std::string::npos);
  std::vector<float> out(rows * cols);
  EXPECT_NE(BitDpReduce({p, neg}, rows, cols, 2, BitDpReduction::kExact, out.data()).message().find("replica 1"),
            std::string::npos);
}

TEST(BitDpTest, OnlyLinearWeightMatricesAreQuantised) {
  EXPECT_TRUE(BitDpAppliesTo("h.3.attn.c_attn.weight", {384, 128}));
  EXPECT_TRUE(BitDpAppliesTo("h.0.attn.c_proj.weight", {128, 128}));
  EXPECT_TRUE(BitDpAppliesTo("h.1.mlp.c_fc.weight", {512, 128}));
  EXPECT_TRUE(BitDpAppliesTo("h.1.mlp.c_proj.weight", {128, 512}));
  EXPECT_FALSE(BitDpAppliesTo("h.1.mlp.c_fc.bias", {512}));
  EXPECT_FALSE(BitDpAppliesTo("h.1.ln_1.weight", {128}));
  EXPECT_FALSE(BitDpAppliesTo("wte.weight", {256, 128}));
  EXPECT_FALSE(BitDpAppliesTo("wpe.weight", {64, 128}));
  EXPECT_FALSE(BitDpAppliesTo("lm_head.weight", {256, 128}));
}

}  // namespace
}  // namespace longhaul::codec
