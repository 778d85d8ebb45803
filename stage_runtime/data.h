// Training data. Batches are drawn at offsets from a generator seeded by (seed, step,
// micro-batch), so any process can rebuild any batch (stage 0 samples the tokens, the last stage
// the matching labels), and resuming at step k sees exactly the batches an uninterrupted run would.
// Two formats behind one interface:
//   TextDataset       byte-level text (the tokenizer is the identity on bytes, vocab 256): every
//                     file of a directory, or one file;
//   TokenFileDataset  pre-tokenized flat little-endian uint16 files, `train.bin` and `val.bin` in
//                     one directory (the layout nanoGPT-style pipelines and `longhaulctl data
//                     prepare` write), memory-mapped, every token checked against the vocab once.
//
//   absl::StatusOr<std::unique_ptr<Dataset>> ds = OpenDataset({"tokens-u16", "/data/owt", 50257});
//   Batch b = (*ds)->Sample(Split::kTrain, seed, step, mb, /*batch=*/8, /*context=*/1024);
//
// Threading: Sample is const and may be called from several threads.
#ifndef LONGHAUL_STAGE_RUNTIME_DATA_H_
#define LONGHAUL_STAGE_RUNTIME_DATA_H_

#include <cstdint>
#include <memory>
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

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual Batch Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int context) const = 0;
  // Tokens in each split.
  virtual int64_t train_tokens() const = 0;
  virtual int64_t val_tokens() const = 0;
};

struct DataSpec {
  std::string format = "text";  // "text" | "tokens-u16"
  std::string path = kDefaultCorpusDir;  // text: a directory or one file; tokens-u16: a directory
  int vocab = 256;              // tokens-u16: every token must be below it; text: must be >= 256
  double val_fraction = 0.1;    // text only (token files come split)
};
// Opens (and validates) the data; `context` is the model's, so that a split too short to hold one
// sequence is an error here rather than later.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const DataSpec& spec, int context);

class TextDataset final : public Dataset {
 public:
  // A directory: every regular file in it (sorted by name; symlinks and *.dat index files skipped);
  // or a single file.
  static absl::StatusOr<TextDataset> FromPath(const std::string& path, double val_fraction = 0.1);
  static absl::StatusOr<TextDataset> FromDirectory(const std::string& dir, double val_fraction = 0.1) {
    return FromPath(dir, val_fraction);
  }
  static absl::StatusOr<TextDataset> FromText(std::string text, double val_fraction = 0.1);
  static absl::StatusOr<TextDataset> DefaultCorpus() { return FromPath(kDefaultCorpusDir); }

  Batch Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int context) const override;
  int64_t train_tokens() const override { return static_cast<int64_t>(train_.size()); }
  int64_t val_tokens() const override { return static_cast<int64_t>(val_.size()); }
  size_t train_bytes() const { return train_.size(); }
  size_t val_bytes() const { return val_.size(); }

 private:
  std::string train_, val_;
};

class TokenFileDataset final : public Dataset {
 public:
  // <dir>/train.bin and <dir>/val.bin. Errors name the file: missing, empty, odd length, too short
  // for one sequence of `context` + 1 tokens, or a token >= vocab (with its offset).
  static absl::StatusOr<std::unique_ptr<TokenFileDataset>> Open(const std::string& dir, int vocab, int context);
  ~TokenFileDataset() override;

  Batch Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int context) const override;
  int64_t train_tokens() const override { return train_.tokens; }
  int64_t val_tokens() const override { return val_.tokens; }

 private:
  struct Mapped {
    const uint16_t* data = nullptr;
    int64_t tokens = 0;
    size_t bytes = 0;
  };
  TokenFileDataset() = default;
  static absl::Status Map(const std::string& path, int vocab, int context, Mapped* out);
  Mapped train_, val_;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_DATA_H_
