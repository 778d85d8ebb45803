// No Abseil header may be included here (see sentencepiece_wrap.h).
#include "stage_runtime/sentencepiece_wrap.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace longhaul::stage_runtime::sp {

std::string Train(const std::string& args) {
  const sentencepiece::util::Status s = sentencepiece::SentencePieceTrainer::Train(args);
  return s.ok() ? std::string() : s.ToString();
}

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::string Tokenizer::Load(const std::string& model_path) {
  const sentencepiece::util::Status s = impl_->processor.Load(model_path);
  return s.ok() ? std::string() : s.ToString();
}

int Tokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

std::string Tokenizer::Encode(const std::string& text, std::vector<int>* ids) const {
  const sentencepiece::util::Status s = impl_->processor.Encode(text, ids);
  return s.ok() ? std::string() : s.ToString();
}

}  // namespace longhaul::stage_runtime::sp
