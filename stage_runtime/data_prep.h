// Data preparation (`longhaul-data prepare`): text in, the tokens-u16 layout out.
//   <out>/train.bin, <out>/val.bin   flat little-endian uint16 token ids (data.h's TokenFileDataset)
//   <out>/tokenizer.model            the SentencePiece model that produced them
//   <out>/meta.json                  {"format": "tokens-u16", "vocab_size": N, "train_tokens": ...}
// The tokenizer is a SentencePiece BPE model trained on the input text (or an existing one). The
// model's `vocab` must be at least vocab_size (GPT-2 presets have 50257).
//
// The text is read and tokenized in pieces of about 1 MiB ending at a line break, so memory stays
// bounded whatever the corpus size (SentencePiece's trainer samples at most `train_sentences`
// lines). The last `val_fraction` of the text, cut at a line break, becomes val.bin.
// Link it into no process that loads libprotobuf (gRPC, LibTorch): Debian's libsentencepiece
// carries its own copy of protobuf's symbols, and the two collide at start-up (a crash in
// protobuf's static initialisers). Hence a tool of its own, longhaul-data.
#ifndef LONGHAUL_STAGE_RUNTIME_DATA_PREP_H_
#define LONGHAUL_STAGE_RUNTIME_DATA_PREP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, or directories (their regular files, *.dat skipped)
  std::string out_dir;
  std::string tokenizer;            // an existing SentencePiece model; empty: train one
  int vocab_size = 8000;            // when training: 256..65536
  double val_fraction = 0.05;       // (0, 0.5]
  int64_t train_sentences = 2000000;  // lines the trainer samples at most
  std::function<void(const std::string&)> progress;  // one line per phase (may be empty)
};

struct PrepareResult {
  int vocab_size = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t text_bytes = 0;
};

absl::StatusOr<PrepareResult> PrepareTokenData(const PrepareOptions& options);

// The text files under `inputs` (a file as given; a directory's regular files sorted by name,
// symlinks and *.dat index files skipped), or an error naming the input that is neither.
absl::StatusOr<std::vector<std::string>> ListTextFiles(const std::vector<std::string>& inputs);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_DATA_PREP_H_
