// A thin wrapper over SentencePiece for data_prep.cc. SentencePiece's headers declare their own
// `absl::string_view`, which clashes with Abseil's, so they are included only by
// sentencepiece_wrap.cc, which includes no Abseil header; this interface uses the standard library
// only (errors are returned as messages, empty when all went well).
#ifndef LONGHAUL_STAGE_RUNTIME_SENTENCEPIECE_WRAP_H_
#define LONGHAUL_STAGE_RUNTIME_SENTENCEPIECE_WRAP_H_

#include <memory>
#include <string>
#include <vector>

namespace longhaul::stage_runtime::sp {

// SentencePieceTrainer::Train with command-line style arguments.
std::string Train(const std::string& args);

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  std::string Load(const std::string& model_path);
  int vocab_size() const;
  std::string Encode(const std::string& text, std::vector<int>* ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longhaul::stage_runtime::sp

#endif  // LONGHAUL_STAGE_RUNTIME_SENTENCEPIECE_WRAP_H_
