#include "stage_runtime/model.h"

#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {
namespace {

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptConfig& c) : heads_(c.heads) {
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

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads_;
    auto qkv = c_attn_(ln_1_(x)).split(c, 2);
    auto shape = [&](const torch::Tensor& y) { return y.view({b, t, heads_, hd}).transpose(1, 2); };
    auto q = shape(qkv[0]), k = shape(qkv[1]), v = shape(qkv[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask = torch::ones({t, t}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    auto h = x + attn_proj_(y);
    return h + mlp_proj_(torch::gelu(c_fc_(ln_2_(h)), "tanh"));
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  torch::nn::Linear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
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

absl::StatusOr<std::vector<LayerRange>> PartitionLayers(int layers, int stages) {
  if (stages < 1 || stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", layers, " layers into ", stages, " stages (need 1 <= stages <= layers)"));
  }
  std::vector<LayerRange> r;
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int n = layers / stages + (s < layers % stages ? 1 : 0);
    r.push_back({begin, begin + n});
    begin += n;
  }
  return r;
}

GptStageImpl::GptStageImpl(const GptConfig& cfg, LayerRange range, bool first, bool last,
                           uint64_t seed)
    : cfg_(cfg), range_(range), first_(first), last_(last) {
  if (first_) {
    wte_ = register_module("wte", torch::nn::Embedding(cfg.vocab, cfg.hidden));
    wpe_ = register_module("wpe", torch::nn::Embedding(cfg.context, cfg.hidden));
  }
  auto h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int i = range.begin; i < range.end; ++i) {
    blocks_.push_back(h->register_module(std::to_string(i), Block(cfg).ptr()));
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
    x = wte_(input) + wpe_(torch::arange(t, torch::kLong)).unsqueeze(0);
  }
  for (auto& b : blocks_) x = b->as<BlockImpl>()->forward(x);
  if (last_) x = lm_head_(ln_f_(x));
  return x;
}

}  // namespace longhaul::stage_runtime
