#include "stage_runtime/mixed_linear.h"

#include <vector>

namespace longhaul::stage_runtime {
namespace {

// The node's saved_data keys.
constexpr char kWeight[] = "weight", kBias[] = "bias", kInputDtype[] = "x_dtype", kInputShape[] = "x_shape";

bool Learns(const torch::Tensor& p) { return p.defined() && p.requires_grad(); }

// Adds a gradient (compute dtype) into a float32 master's .grad, as AccumulateGrad would: the
// first one becomes .grad (a float32 copy), later ones are added in place.
void Accumulate(torch::Tensor master, const torch::Tensor& g) {
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
    // The result keeps x's leading dimensions: those before the trailing ones that make `in`.
    std::vector<int64_t> shape = x.sizes().vec();
    int64_t features = 1;
    while (!shape.empty() && features < in) {
      features *= shape.back();
      shape.pop_back();
    }
    TORCH_CHECK(features == in, "MixedLinear: the input's trailing dimensions (", x.sizes(), ") do not make its ", in,
                " features");
    shape.push_back(out);
    // As torch::linear: addmm on the input's rows (its fused path for a contiguous 3-D input),
    // mm without a bias.
    const torch::Tensor x2 = x.reshape({-1, in}).to(w.scalar_type());
    const torch::Tensor y = p->bias_compute.defined() ? torch::addmm(p->bias_compute, x2, w.t()) : torch::mm(x2, w.t());
    ctx->save_for_backward({x2, w});
    // The masters that learn; x's dtype (-1: no gradient wanted) and shape.
    if (Learns(p->weight)) ctx->saved_data[kWeight] = p->weight;
    if (Learns(p->bias)) ctx->saved_data[kBias] = p->bias;
    ctx->saved_data[kInputDtype] = input_grad ? static_cast<int64_t>(x.scalar_type()) : int64_t{-1};
    ctx->saved_data[kInputShape] = x.sizes().vec();
    // Not a view of y: a view made inside a custom Function could not be changed in place later.
    return at::_unsafe_view(y, shape).to(out_dtype);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The node's gradients do not depend on the parameters through autograd (their casts are
    // plain tensors), so a graph of this backward would be wrong.
    TORCH_CHECK(!torch::GradMode::is_enabled(), "MixedLinear has no double backward (create_graph)");
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor dy = grads[0].reshape({-1, w.size(0)}).to(w.scalar_type());
    // The products as LibTorch's addmm backward forms them for a transposed weight.
    const auto& data = ctx->saved_data;
    if (auto it = data.find(kWeight); it != data.end()) Accumulate(it->second.toTensor(), torch::mm(dy.t(), x2));
    if (auto it = data.find(kBias); it != data.end()) Accumulate(it->second.toTensor(), dy.sum(0));
    torch::Tensor dx;
    const int64_t x_dtype = data.at(kInputDtype).toInt();
    if (x_dtype >= 0 && ctx->needs_input_grad(0)) {
      dx = torch::mm(dy, w).view(data.at(kInputShape).toIntVector()).to(static_cast<torch::ScalarType>(x_dtype));
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor MixedLinear(const torch::Tensor& x, const MixedLinearParams& params, torch::ScalarType out_dtype) {
  // Autograd records the node only when a variable of it requires a gradient, and the parameters
  // are not variables of it: for an input that needs none (while a parameter does), a leaf
  // standing in for it, whose gradient is never computed.
  if (torch::GradMode::is_enabled() && !x.requires_grad() && (Learns(params.weight) || Learns(params.bias))) {
    return MixedLinearFunction::apply(x.detach().requires_grad_(true), &params, out_dtype, false);
  }
  return MixedLinearFunction::apply(x, &params, out_dtype, true);
}

}  // namespace longhaul::stage_runtime
