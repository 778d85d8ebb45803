// MixedLinear against the plain form it replaces (the input, weight and bias cast to bfloat16,
// torch::linear, the result cast to the output dtype, autograd through every cast): the same
// outputs and gradients, bit for bit, over several micro-batches' accumulation.
#include "stage_runtime/mixed_linear.h"

#include <gtest/gtest.h>

namespace longhaul::stage_runtime {
namespace {

constexpr auto kCompute = torch::kBFloat16;

struct Case {
  bool bias;
  torch::ScalarType out;
  std::vector<int64_t> input_shape;  // [..., 16]
};

class MixedLinearTest : public ::testing::TestWithParam<Case> {};

TEST_P(MixedLinearTest, MatchesThePlainFormBitForBit) {
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
  for (int mb = 0; mb < 3; ++mb) {
    const torch::Tensor x0 = torch::randn(c.input_shape);
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
    ASSERT_EQ(x.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(x.grad(), x_ref.grad())) << "micro-batch " << mb;
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(w.grad(), w_ref.grad())) << "micro-batch " << mb;
    if (c.bias) {
      EXPECT_TRUE(torch::equal(b.grad(), b_ref.grad())) << "micro-batch " << mb;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MixedLinearTest,
                         ::testing::Values(Case{true, kCompute, {2, 5, 16}}, Case{true, torch::kFloat32, {2, 5, 16}},
                                           Case{false, kCompute, {7, 16}}, Case{true, torch::kFloat32, {7, 16}}));

// An input that needs no gradient still brings the parameters theirs; no graph without grad mode.
TEST(MixedLinearTest, ParametersLearnWithoutAnInputGradient) {
  torch::Tensor w = torch::randn({4, 8}).requires_grad_(true), b = torch::zeros({4}).requires_grad_(true);
  MixedLinearParams p{w, b, w.detach().to(kCompute), b.detach().to(kCompute)};
  const torch::Tensor x = torch::randn({3, 8});
  MixedLinear(x, p, torch::kFloat32).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_GT(w.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({4}, 3.0f)));
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(MixedLinear(x, p, torch::kFloat32).requires_grad());
}

}  // namespace
}  // namespace longhaul::stage_runtime
