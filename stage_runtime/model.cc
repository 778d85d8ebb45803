#include "stage_runtime/model.h"

#include <cmath>
#include <functional>
#include <limits>

#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "stage_runtime/mixed_linear.h"

namespace longhaul::stage_runtime {

const torch::Tensor& CastCache::Get(const torch::Tensor& p, torch::ScalarType compute) {
  if (!cast.defined() || source_data != p.data_ptr() || source_version != static_cast<int64_t>(p._version())) {
    torch::NoGradGuard no_grad;  // MixedLinear takes the gradients to the parameter itself
    cast = p.to(compute);
    source_data = p.data_ptr();
    source_version = static_cast<int64_t>(p._version());
  }
  return cast;
}

namespace {

// y = x W^T + b in the compute dtype, returned in `out` (MixedLinear: the float32 parameters' casts
// from the caches, their gradients accumulated in float32). With float32 compute the parameters
// are used directly.
torch::Tensor Project(torch::nn::Linear l, const torch::Tensor& x, torch::ScalarType compute, torch::ScalarType out,
                      CastCache& weight, CastCache& bias) {
  // x may hold its features over its last two dimensions (attention's [B, T, heads, hd] view).
  if (compute == torch::kFloat32) return l(x.size(-1) == l->weight.size(1) ? x : x.flatten(-2)).to(out);
  const torch::Tensor& b = l->bias;
  const MixedLinearParams p{l->weight, b, weight.Get(l->weight, compute),
                            b.defined() ? bias.Get(b, compute) : torch::Tensor()};
  return MixedLinear(x, p, out);
}

// Causal self-attention over [B, heads, T, hd]. LibTorch 2.x has fused kernels (flash / memory-
// efficient on the GPU); 1.x (Debian's CPU LibTorch) the explicit form.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  return torch::matmul(att, v);
#endif
}

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptConfig& c, torch::ScalarType compute) : heads_(c.heads), compute_(compute) {
    const int h = c.hidden;
    ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
    auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
    c_attn_ = attn->register_module("c_attn", torch::nn::Linear(h, 3 * h));
    attn_proj_ = attn->register_module("c_proj", torch::nn::Linear(h, h));
    ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h})));
    auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
    c_fc_ = mlp->register_module("c_fc", torch::nn::Linear(h, 4 * h));
    mlp_proj_ = mlp->register_module("c_proj", torch::nn::Linear(4 * h, h));
  }

  // x: the float32 residual stream [B, T, C].
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads_;
    // q, k, v as [B, heads, T, hd] views of c_attn's output, and attention's output as a
    // [B, T, heads, hd] view for c_proj (MixedLinear flattens it): few autograd nodes, the same
    // tensors as splitting, viewing and transposing each.
    auto qkv = Project(c_attn_, ln_1_(x), compute_, compute_, casts_[0], casts_[1])
                   .view({b, t, 3, heads_, hd})
                   .permute({2, 0, 3, 1, 4})
                   .unbind(0);
    auto y = CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2);
    auto h = x + Project(attn_proj_, y, compute_, x.scalar_type(), casts_[2], casts_[3]);
    auto m = torch::gelu(Project(c_fc_, ln_2_(h), compute_, compute_, casts_[4], casts_[5]), "tanh");
    return h + Project(mlp_proj_, m, compute_, h.scalar_type(), casts_[6], casts_[7]);
  }

 private:
  int64_t heads_;
  torch::ScalarType compute_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  torch::nn::Linear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
  CastCache casts_[8];  // weight, bias of c_attn, attn c_proj, c_fc, mlp c_proj (bf16 compute)
};
TORCH_MODULE(Block);

// GPT-2 initialisation: N(0, 0.02) for weights and embeddings (residual projections scaled by
// 1/sqrt(2 * layers)), zero biases, unit LayerNorm weights. The generator is seeded from the
// parameter's global name, so any partition of the model gets identical values.
void InitParameters(torch::nn::Module& m, const GptConfig& cfg, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& kv : m.named_parameters()) {
    const std::string& name = kv.key();
    torch::Tensor p = kv.value();
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else if (is_norm) {
      p.fill_(1.0);
    } else {
      const uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(name);
      auto gen = at::detail::createCPUGenerator(s);
      double std = 0.02;
      if (name.find("c_proj.weight") != std::string::npos) std /= std::sqrt(2.0 * cfg.layers);
      p.normal_(0.0, std, gen);
    }
  }
}

}  // namespace

absl::Status GptConfig::Validate() const {
  if (layers < 1 || hidden < 1 || heads < 1 || context < 1 || vocab < 1) {
    return absl::InvalidArgumentError("model layers, hidden, heads, context and vocab must be >= 1");
  }
  if (hidden % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hidden ", hidden, " is not divisible by heads ", heads));
  }
  return absl::OkStatus();
}

GptStageImpl::GptStageImpl(const GptConfig& cfg, LayerRange range, bool first, bool last,
                           uint64_t seed, torch::ScalarType compute)
    : cfg_(cfg), range_(range), first_(first), last_(last), compute_(compute) {
  if (first_) {
    wte_ = register_module("wte", torch::nn::Embedding(cfg.vocab, cfg.hidden));
    wpe_ = register_module("wpe", torch::nn::Embedding(cfg.context, cfg.hidden));
  }
  auto h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int i = range.begin; i < range.end; ++i) {
    blocks_.push_back(h->register_module(std::to_string(i), Block(cfg, compute).ptr()));
  }
  if (last_) {
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    lm_head_ = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden, cfg.vocab).bias(false)));
  }
  InitParameters(*this, cfg, seed);
}

torch::Tensor GptStageImpl::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  if (first_) {
    const int64_t t = input.size(1);
    x = wte_(input) + wpe_(torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(input.device()))).unsqueeze(0);
  }
  for (auto& b : blocks_) x = b->as<BlockImpl>()->forward(x);
  if (last_) x = Project(lm_head_, ln_f_(x), compute_, compute_, lm_head_casts_[0], lm_head_casts_[1]);
  return x;
}

}  // namespace longhaul::stage_runtime
