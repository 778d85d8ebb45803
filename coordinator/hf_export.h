// Hugging Face export: a job's per-stage checkpoints (stage_runtime's safetensors files, format
// "longhaul-stage-v1") gathered into one GPT-2 directory that
// `transformers.GPT2LMHeadModel.from_pretrained(dir)` loads: config.json + model.safetensors.
// Plain C++ (no LibTorch), so that longhaulctl stays small; tensors are streamed file to file, one
// at a time (a gpt2-xl export never holds more than its largest tensor in memory).
//
//   HfExport e;
//   e.model = {.layers = 4, .hidden = 128, .heads = 4, .context = 64, .vocab = 256};
//   e.stages = {{0, "/data/jobs/7/stage-0.safetensors", 0, 2}, {1, ".../stage-1.safetensors", 2, 4}};
//   e.out_dir = "gpt2-job7";
//   absl::StatusOr<HfExportResult> r = ExportHuggingFaceGpt2(e);
//
// Why the result is exactly GPT-2 (stage_runtime/model.h): same parameter names and shapes, learned
// positional embeddings, pre-LayerNorm blocks with eps 1e-5 (torch's default = GPT-2's), the tanh
// GELU ("gelu_new"), biases everywhere but lm_head, attention scaled by 1/sqrt(head size), no
// dropout (the config says 0, so fine-tuning behaves as our training did). Two differences HF's
// config expresses: untied embeddings (tie_word_embeddings: false, lm_head.weight stored) and
// torch Linear weights ([out, in]) where HF's Conv1D has [in, out] (transposed here). Anything else
// in a checkpoint (a tensor GPT-2 has no place for, a missing one, another shape, another format)
// is an error naming the file and tensor, never a silently different model. The integration test
// (tests/integration/hf_export_test.cc) compares transformers' logits with ours.
#ifndef LONGHAUL_COORDINATOR_HF_EXPORT_H_
#define LONGHAUL_COORDINATOR_HF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::coordinator {

struct HfModelShape {
  int layers = 0, hidden = 0, heads = 0, context = 0, vocab = 0;
};

struct HfStageCheckpoint {
  int stage = 0;
  std::string path;  // the stage's safetensors file
  int layer_begin = 0, layer_end = 0;  // the blocks it holds, [begin, end)
};

struct HfExport {
  HfModelShape model;
  std::vector<HfStageCheckpoint> stages;  // every stage, in order
  std::string out_dir;                    // created if missing; config.json and model.safetensors replaced
  // Recorded under "longhaul" in config.json (provenance; transformers keeps unknown keys).
  uint64_t job_id = 0;
  std::string job_name;
  std::string data_format;  // the job's data.format: "text" means the token ids are UTF-8 bytes
};

struct HfExportResult {
  int64_t step = 0;        // the training step every stage's checkpoint was written after
  int64_t parameters = 0;  // number of model parameters exported
  uint64_t bytes = 0;      // size of model.safetensors
};

absl::StatusOr<HfExportResult> ExportHuggingFaceGpt2(const HfExport& e);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_HF_EXPORT_H_
