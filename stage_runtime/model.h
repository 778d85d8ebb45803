// GPT-2-style decoder, partitioned into pipeline stages by layer ranges.
//
// Parameter names match Hugging Face GPT-2 one to one (wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn,
// h.<i>.attn.c_proj, h.<i>.ln_2, h.<i>.mlp.c_fc, h.<i>.mlp.c_proj, ln_f, lm_head). HF stores the
// Conv1D weights transposed ([in, out]); ours are torch Linear weights ([out, in]): import/export
// transposes c_attn, c_proj and c_fc weights. Embeddings are untied by default: with tying, the
// last stage would hold a copy of wte and the two copies' gradients would be summed between the
// first and last stage before each optimizer step (not implemented).
//
//   GptConfig cfg{.layers = 4, .hidden = 128, .heads = 4, .context = 64, .vocab = 256};
//   auto parts = PartitionLayers(cfg.layers, 4);       // partition.h: {[0,1), [1,2), [2,3), [3,4)}
//   GptStage stage0(cfg, parts[0], /*first=*/true, /*last=*/false, /*seed=*/1);
//
// Initialisation is deterministic per parameter *name* (seeded from seed and the name), so a
// partitioned model starts with exactly the weights of the unpartitioned one.
#ifndef LONGHAUL_STAGE_RUNTIME_MODEL_H_
#define LONGHAUL_STAGE_RUNTIME_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "stage_runtime/partition.h"  // LayerRange, PartitionLayers (torch-free)

namespace longhaul::stage_runtime {

struct GptConfig {
  int layers = 4;
  int hidden = 128;
  int heads = 4;
  int context = 64;
  int vocab = 256;
  absl::Status Validate() const;
};

// A parameter cast to the compute dtype, made once and reused until the parameter changes: the
// optimizer steps once per several micro-batches, so casting in every micro-batch's forward would
// repeat the same elementwise pass over all weights. The cast is made without autograd: MixedLinear
// (mixed_linear.h) adds each micro-batch's gradient into the float32 parameter's .grad itself. It
// is made again when the parameter's storage or version counter changed (an optimizer step, a
// checkpoint load, a move to another device).
// Used by the stage and its blocks for bfloat16 compute; not thread-safe (nor is the module).
struct CastCache {
  torch::Tensor cast;
  const void* source_data = nullptr;
  int64_t source_version = -1;

  const torch::Tensor& Get(const torch::Tensor& p, torch::ScalarType compute);
};

class GptStageImpl : public torch::nn::Module {
 public:
  // `compute`: the dtype of matrix products and attention (float32, or bfloat16 with float32
  // parameters, LayerNorm and residual stream; see executor.h's Precision).
  GptStageImpl(const GptConfig& cfg, LayerRange range, bool first, bool last, uint64_t seed,
               torch::ScalarType compute = torch::kFloat32);

  // First stage: input is int64 token ids [B, T]; others: hidden states [B, T, H].
  // Last stage returns logits [B, T, V]; others hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input);

  bool first() const { return first_; }
  bool last() const { return last_; }
  const GptConfig& config() const { return cfg_; }

 private:
  GptConfig cfg_;
  LayerRange range_;
  bool first_, last_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;  // registered as h.<global index>
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
  torch::ScalarType compute_;
  CastCache lm_head_casts_[2];  // weight, (no) bias
};
TORCH_MODULE(GptStage);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_MODEL_H_
