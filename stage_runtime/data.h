// Byte-level text data: the tokenizer is the identity on bytes (vocab 256). Batches are drawn at
// offsets from a generator seeded by (seed, step, micro-batch), so any process can rebuild any
// batch, and resuming at step k sees exactly the batches an uninterrupted run would.
//
//   auto ds = TextDataset::DefaultCorpus();                 // fortunes, 90% train / 10% validation
//   Batch b = ds->Sample(Split::kTrain, seed, step, mb, /*batch=*/8, /*context=*/64);
#ifndef LONGHAUL_STAGE_RUNTIME_DATA_H_
#define LONGHAUL_STAGE_RUNTIME_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

inline constexpr char kDefaultCorpusDir[] = "/usr/share/games/fortunes";

enum class Split { kTrain, kValidation };

struct Batch {
  torch::Tensor tokens;  // int64 [B, T]
  torch::Tensor labels;  // int64 [B, T], tokens shifted by one
};

class TextDataset {
 public:
  // Every regular file in `dir` (sorted by name; symlinks and *.dat index files skipped).
  static absl::StatusOr<TextDataset> FromDirectory(const std::string& dir, double val_fraction = 0.1);
  static absl::StatusOr<TextDataset> FromText(std::string text, double val_fraction = 0.1);
  static absl::StatusOr<TextDataset> DefaultCorpus() { return FromDirectory(kDefaultCorpusDir); }

  Batch Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int context) const;
  size_t train_bytes() const { return train_.size(); }
  size_t val_bytes() const { return val_.size(); }

 private:
  std::string train_, val_;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_DATA_H_
