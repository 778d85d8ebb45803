// MixedLinear against the plain form it replaces (the input, weight and bias cast to bfloat16,
// torch::linear, the result cast to the output dtype, autograd through every cast): the same
// outputs and gradients, bit for bit, over several micro-batches' accumulation. The GPU's cuBLAS
// products at a GPT-2-XL layer's shape: tests/gpu/gpu_stage_test.cc.
#include "stage_runtime/mixed_linear.h"

#include <gtest/gtest.h>

#include "stage_runtime/executor.h"

namespace longhaul::stage_runtime {
namespace {

constexpr auto kCompute = torch::kBFloat16;

struct Case {
  bool bias;
  torch::ScalarType in, out;
  std::vector<int64_t> input_shape;  // [..., 16]
};

class MixedLinearMatchTest : public ::testing::TestWithParam<Case> {};

// Five micro-batches, the gradients zeroed after the third (as the optimizer step leaves them).
TEST_P(MixedLinearMatchTest, MatchesThePlainFormBitForBit) {
  const Case c = GetParam();
  torch::manual_seed(7);
  const torch::Tensor w0 = torch::randn({24, 16}) * 0.2, b0 = torch::randn({24});
  // The two forms' own float32 parameters, from the same values.
  torch::Tensor w_ref = w0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  torch::Tensor b_ref, b;
  if (c.bias) {
    b_ref = b0.clone().requires_grad_(true);
    b = b0.clone().requires_grad_(true);
  }
  MixedLinearParams p{w, b, w.detach().to(kCompute), c.bias ? b.detach().to(kCompute) : torch::Tensor()};
  for (int mb = 0; mb < 5; ++mb) {
    if (mb == 3) {
      torch::NoGradGuard no_grad;
      for (torch::Tensor* t : {&w, &w_ref, &b, &b_ref}) {
        if (t->defined()) t->mutable_grad().zero_();
      }
    }
    const torch::Tensor x0 = torch::randn(c.input_shape).to(c.in);
    std::vector<int64_t> out_shape = c.input_shape;
    out_shape.back() = 24;
    const torch::Tensor dy = torch::randn(out_shape).to(c.out);
    torch::Tensor x_ref = x0.clone().requires_grad_(true), x = x0.clone().requires_grad_(true);
    const torch::Tensor y_ref =
        torch::linear(x_ref.to(kCompute), w_ref.to(kCompute), c.bias ? b_ref.to(kCompute) : torch::Tensor()).to(c.out);
    const torch::Tensor y = MixedLinear(x, p, c.out);
    ASSERT_EQ(y.scalar_type(), c.out);
    ASSERT_EQ(y.sizes(), y_ref.sizes());
    EXPECT_TRUE(torch::equal(y, y_ref)) << "micro-batch " << mb;
    y_ref.backward(dy);
    y.backward(dy);
    ASSERT_EQ(x.grad().scalar_type(), c.in);
    EXPECT_TRUE(torch::equal(x.grad(), x_ref.grad())) << "micro-batch " << mb;
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(w.grad(), w_ref.grad())) << "micro-batch " << mb;
    if (c.bias) {
      EXPECT_TRUE(torch::equal(b.grad(), b_ref.grad())) << "micro-batch " << mb;
    }
  }
}

// The model's calls: LayerNorm's float32 output into c_attn and c_fc (bf16 out), attention's and
// GELU's bf16 output into the projections (float32 out, the residual stream), the LM head without
// bias; and 2-D inputs.
INSTANTIATE_TEST_SUITE_P(
    Shapes, MixedLinearMatchTest,
    ::testing::Values(Case{true, torch::kFloat32, kCompute, {2, 5, 16}}, Case{true, kCompute, torch::kFloat32, {2, 5, 16}},
                      Case{false, torch::kFloat32, kCompute, {2, 5, 16}}, Case{false, torch::kFloat32, kCompute, {7, 16}},
                      Case{true, torch::kFloat32, torch::kFloat32, {7, 16}}));

// Attention's output as the model passes it, a [B, T, heads, hd] view of [B, heads, T, hd]: the
// plain form's numbers on it made contiguous and viewed as [B, T, C].
TEST(MixedLinearTest, TakesAttentionsOutputAsAView) {
  torch::manual_seed(11);
  const torch::Tensor w0 = torch::randn({16, 16}) * 0.2, b0 = torch::randn({16});
  torch::Tensor w_ref = w0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  torch::Tensor b_ref = b0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  MixedLinearParams p{w, b, w.detach().to(kCompute), b.detach().to(kCompute)};
  const torch::Tensor a0 = torch::randn({2, 4, 5, 4}).to(kCompute);  // [B, heads, T, hd]
  const torch::Tensor dy = torch::randn({2, 5, 16});
  torch::Tensor a_ref = a0.clone().requires_grad_(true), a = a0.clone().requires_grad_(true);
  const torch::Tensor y_ref = torch::linear(a_ref.transpose(1, 2).contiguous().view({2, 5, 16}), w_ref.to(kCompute),
                                            b_ref.to(kCompute))
                                  .to(torch::kFloat32);
  const torch::Tensor y = MixedLinear(a.transpose(1, 2), p, torch::kFloat32);
  ASSERT_EQ(y.sizes(), y_ref.sizes());
  EXPECT_TRUE(torch::equal(y, y_ref));
  y_ref.backward(dy);
  y.backward(dy);
  EXPECT_TRUE(torch::equal(a.grad(), a_ref.grad()));
  EXPECT_TRUE(torch::equal(w.grad(), w_ref.grad()));
  EXPECT_TRUE(torch::equal(b.grad(), b_ref.grad()));
  EXPECT_THROW(MixedLinear(torch::randn({2, 5, 12}), p, torch::kFloat32), std::exception);  // 12 features, not 16
}

// An input that needs no gradient still brings the parameters theirs; a parameter that learns
// nothing gets none; no graph without grad mode; no double backward.
TEST(MixedLinearTest, GradientsGoWhereTheyAreWanted) {
  torch::Tensor w = torch::randn({4, 8}).requires_grad_(true), b = torch::zeros({4}).requires_grad_(true);
  MixedLinearParams p{w, b, w.detach().to(kCompute), b.detach().to(kCompute)};
  const torch::Tensor x = torch::randn({3, 8});
  MixedLinear(x, p, torch::kFloat32).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_GT(w.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({4}, 3.0f)));

  torch::Tensor frozen = torch::randn({4, 8});
  MixedLinearParams q{frozen, b, frozen.to(kCompute), b.detach().to(kCompute)};
  torch::Tensor x2 = torch::randn({3, 8}).requires_grad_(true);
  MixedLinear(x2, q, torch::kFloat32).sum().backward();
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({4}, 6.0f)));
  EXPECT_TRUE(x2.grad().defined());

  torch::Tensor x3 = torch::randn({3, 8}).requires_grad_(true);
  const torch::Tensor y = MixedLinear(x3, p, torch::kFloat32).sum();
  EXPECT_THROW(torch::autograd::grad({y}, {x3}, {}, /*retain_graph=*/true, /*create_graph=*/true), c10::Error);

  torch::NoGradGuard no_grad;
  EXPECT_FALSE(MixedLinear(x, p, torch::kFloat32).requires_grad());
}

// A bf16 stage computes with its weights as the optimizer step left them (the casts are made
// again after every step): the same forward as a fresh stage given the stepped parameters.
TEST(MixedLinearTest, Bf16StageUsesTheSteppedWeights) {
  StageSpec spec;
  spec.model = GptConfig{.layers = 2, .hidden = 32, .heads = 4, .context = 8, .vocab = 64};
  spec.layers = {0, 2};
  spec.precision = Precision::kBf16;
  spec.optimizer.lr = 1e-2;
  spec.optimizer.warmup_steps = 0;
  auto a = StageExecutor::Create(spec);
  auto fresh = StageExecutor::Create(spec);
  ASSERT_TRUE(a.ok() && fresh.ok());
  const torch::Tensor tokens = torch::randint(64, {2, 8}, torch::kLong);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*a)->Forward(0, tokens, tokens).ok());
    ASSERT_TRUE((*a)->Backward(0).ok());
    ASSERT_TRUE((*a)->Step(1.0).ok());
  }
  {
    torch::NoGradGuard no_grad;
    auto to = (*fresh)->model()->named_parameters();
    for (const auto& kv : (*a)->model()->named_parameters()) to[kv.key()].copy_(kv.value());
  }
  auto after = (*a)->Evaluate(tokens, tokens);
  auto expected = (*fresh)->Evaluate(tokens, tokens);
  ASSERT_TRUE(after.ok() && expected.ok());
  EXPECT_TRUE(torch::equal(*after, *expected)) << after->item<float>() << " vs " << expected->item<float>();
}

}  // namespace
}  // namespace longhaul::stage_runtime
