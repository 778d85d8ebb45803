// MixedLinear: y = x W^T + b with the product in a narrower compute dtype (bfloat16) and float32
// master parameters, as one autograd node per call.
//
// The plain form -- x.to(bf16), torch::linear against W.to(bf16) and b.to(bf16), the result cast
// back -- records about nine autograd nodes per call (the casts of x, W, b and of the result, the
// views of a 3-D input, the transpose, the product), and every micro-batch's backward runs the
// weight's and bias's cast nodes and their AccumulateGrad. At one 1,024-token sequence per
// micro-batch the host of a GPT-2-XL stage, queueing such nodes, took about 20 ms a micro-batch
// against about 10 ms of GPU work (docs/gpu.md, "The sweep's micro-batch"). Here the backward adds
// the weight's and bias's gradients straight into the float32 parameters' .grad and returns only
// the input's gradient.
//
// For a contiguous 2-D or 3-D input (the model's other calls) the numbers are those of the plain
// form, operation for operation: the same products (the weight's gradient as dY^T X, the input's
// as dY W, as LibTorch's addmm backward computes them for a transposed weight), the bias's
// gradient summed in the compute dtype, each gradient rounded to the compute dtype before it is
// accumulated in float32, in the order the micro-batches' backward passes run
// (tests/stage_runtime/mixed_linear_test.cc and, on a GPU, tests/gpu/gpu_stage_test.cc compare
// them bit for bit); for attention's output, a non-contiguous [B, T, heads, hd] view, they are
// those of the plain form applied to it made contiguous and viewed as [B, T, C], which is what
// the model did before. Other inputs work, with products that may round differently.
//
// Unlike AccumulateGrad, the node writes the parameters' .grad whenever it runs (also in a
// torch::autograd::grad for other tensors), passes no parameter hooks, and has no double backward
// (create_graph is refused). Nothing in longhaul needs those.
//
// Threading: the backward runs on LibTorch's autograd thread, which is also where AccumulateGrad
// would have run; the parameters' .grad must not be read or written elsewhere during a backward.
#ifndef LONGHAUL_STAGE_RUNTIME_MIXED_LINEAR_H_
#define LONGHAUL_STAGE_RUNTIME_MIXED_LINEAR_H_

#include <torch/torch.h>

namespace longhaul::stage_runtime {

// The parameters of one MixedLinear call: the float32 masters (leaves; their .grad receives the
// gradients) and their casts to the compute dtype, made without autograd (CastCache in model.h).
// The bias pair is undefined for a layer without bias.
struct MixedLinearParams {
  torch::Tensor weight, bias;                  // float32, [out, in] and [out]
  torch::Tensor weight_compute, bias_compute;  // the same in the compute dtype
};

// x: [..., in] in any floating dtype (cast to the compute dtype on the way in; its gradient comes
// back in x's dtype), or with the features over its trailing dimensions ([..., heads, hd], a view
// that need not be contiguous: it is flattened as reshape does). The result is [..., out] in
// `out_dtype`. The call keeps what its backward needs (the tensors, not `params` itself).
torch::Tensor MixedLinear(const torch::Tensor& x, const MixedLinearParams& params, torch::ScalarType out_dtype);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_MIXED_LINEAR_H_
