#include "stage_runtime/mixed_linear.h"

#include <vector>

namespace longhaul::stage_runtime {
namespace {

// Adds a gradient (compute dtype) into a float32 master's .grad, as AccumulateGrad would: the
// first one becomes .grad (a float32 copy), later ones are added in place.
void Accumulate(torch::Tensor master, const torch::Tensor& g) {
  if (!master.requires_grad()) return;
  torch::Tensor& grad = master.mutable_grad();
  if (!grad.defined()) {
    grad = g.to(master.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  } else {
    grad.add_(g);
  }
}

class MixedLinearFunction : public torch::autograd::Function<MixedLinearFunction> {
 public:
  // Only x is a variable of the node: the parameters' gradients bypass autograd (Accumulate).
  // input_grad: whether x's gradient is wanted (x may be a stand-in, MixedLinear below).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const MixedLinearParams* p, torch::ScalarType out_dtype, bool input_grad) {
    const torch::Tensor& w = p->weight_compute;
    const int64_t in = w.size(1), out = w.size(0);
    // As torch::linear: addmm on the input's rows (its fused path for a contiguous 3-D input),
    // mm without a bias.
    const torch::Tensor x2 = x.reshape({-1, in}).to(w.scalar_type());
    torch::Tensor y = p->bias_compute.defined() ? torch::addmm(p->bias_compute, x2, w.t()) : torch::mm(x2, w.t());
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    ctx->save_for_backward({x2, w});
    ctx->saved_data["weight"] = p->weight;
    ctx->saved_data["has_bias"] = p->bias.defined();
    if (p->bias.defined()) ctx->saved_data["bias"] = p->bias;
    ctx->saved_data["input_grad"] = input_grad;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    return y.view(shape).to(out_dtype);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor dy = grads[0].reshape({-1, w.size(0)}).to(w.scalar_type());
    // The products as LibTorch's addmm backward forms them for a transposed weight.
    Accumulate(ctx->saved_data["weight"].toTensor(), torch::mm(dy.t(), x2));
    if (ctx->saved_data["has_bias"].toBool()) Accumulate(ctx->saved_data["bias"].toTensor(), dy.sum(0));
    torch::Tensor dx;
    if (ctx->needs_input_grad(0) && ctx->saved_data["input_grad"].toBool()) {
      const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      dx = torch::mm(dy, w).view(ctx->saved_data["x_shape"].toIntVector()).to(dtype);
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor MixedLinear(const torch::Tensor& x, const MixedLinearParams& params, torch::ScalarType out_dtype) {
  // Autograd records the node only when a variable of it requires a gradient, and the parameters
  // are not variables of it: for an input that needs none (while a parameter does), a leaf
  // standing in for it, whose gradient is never computed.
  const bool params_learn = params.weight.requires_grad() || (params.bias.defined() && params.bias.requires_grad());
  if (torch::GradMode::is_enabled() && !x.requires_grad() && params_learn) {
    return MixedLinearFunction::apply(x.detach().requires_grad_(true), &params, out_dtype, false);
  }
  return MixedLinearFunction::apply(x, &params, out_dtype, true);
}

}  // namespace longhaul::stage_runtime
