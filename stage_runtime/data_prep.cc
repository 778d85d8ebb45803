#include "stage_runtime/data_prep.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/list_dir.h"
#include "stage_runtime/sentencepiece_wrap.h"

namespace longhaul::stage_runtime {
namespace {

namespace fs = std::filesystem;
constexpr size_t kPieceBytes = size_t{1} << 20;

absl::Status FromSp(const std::string& error, const std::string& what) {
  if (error.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": sentencepiece: ", error));
}

// Reads `files` as one text in pieces of about kPieceBytes that end at a line break.
class TextPieces {
 public:
  explicit TextPieces(std::vector<std::string> files) : files_(std::move(files)) {}
  // The next piece; false at the end. An unreadable file is an error.
  absl::StatusOr<bool> Next(std::string* out) {
    out->clear();
    while (out->size() < kPieceBytes) {
      if (in_.is_open() && in_.bad()) {
        return absl::DataLossError(absl::StrCat("read error in ", files_[next_file_ - 1]));
      }
      if (!in_.is_open() || !in_.good()) {
        if (in_.is_open()) in_.close();
        if (next_file_ == files_.size()) break;
        in_.open(files_[next_file_], std::ios::binary);
        if (!in_) return absl::NotFoundError(absl::StrCat("cannot read ", files_[next_file_]));
        ++next_file_;
      }
      std::string line;
      while (out->size() < kPieceBytes && std::getline(in_, line)) {
        out->append(line);
        out->push_back('\n');
      }
    }
    return !out->empty();
  }

 private:
  std::vector<std::string> files_;
  size_t next_file_ = 0;
  std::ifstream in_;
};

absl::Status WriteTokens(std::ofstream& out, const std::vector<int>& ids, const std::string& path) {
  std::vector<uint16_t> buf(ids.begin(), ids.end());
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 2));
  if (!out) return absl::InternalError(absl::StrCat("write ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListTextFiles(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else if (fs::is_directory(in, ec)) {
      absl::StatusOr<std::vector<std::string>> dir = common::ListRegularFiles(in, ".dat");
      if (!dir.ok()) return dir.status();
      files.insert(files.end(), dir->begin(), dir->end());
    } else {
      return absl::NotFoundError(absl::StrCat("input ", in, " is neither a file nor a directory"));
    }
  }
  if (files.empty()) return absl::InvalidArgumentError("no text files in the inputs");
  return files;
}

absl::StatusOr<PrepareResult> PrepareTokenData(const PrepareOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (o.out_dir.empty()) return absl::InvalidArgumentError("no output directory");
  if (!(o.val_fraction > 0 && o.val_fraction <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat("val_fraction ", o.val_fraction, " must be in (0, 0.5]"));
  }
  if (o.tokenizer.empty() && (o.vocab_size < 256 || o.vocab_size > 65536)) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", o.vocab_size, " must be in 256..65536 (uint16 tokens)"));
  }
  absl::StatusOr<std::vector<std::string>> files = ListTextFiles(o.inputs);
  if (!files.ok()) return files.status();
  int64_t total = 0;
  std::error_code ec;
  for (const std::string& f : *files) {
    const uintmax_t n = fs::file_size(f, ec);
    if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", f, ": ", ec.message()));
    total += static_cast<int64_t>(n);
  }
  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", o.out_dir, ": ", ec.message()));
  const std::string model = o.out_dir + "/tokenizer.model";

  if (o.tokenizer.empty()) {
    say(absl::StrCat("training a SentencePiece BPE tokenizer (vocab ", o.vocab_size, ") on ", files->size(),
                     " file(s), ", total, " bytes"));
    const std::string args = absl::StrCat(
        "--input=", absl::StrJoin(*files, ","), " --model_prefix=", o.out_dir, "/tokenizer",
        " --vocab_size=", o.vocab_size, " --model_type=bpe --character_coverage=1.0 --byte_fallback=true",
        " --input_sentence_size=", o.train_sentences, " --shuffle_input_sentence=true --minloglevel=2",
        " --num_threads=", std::max(1u, std::thread::hardware_concurrency()));
    if (absl::Status s = FromSp(sp::Train(args), "training the tokenizer"); !s.ok()) {
      return s;
    }
  } else if (fs::absolute(o.tokenizer) != fs::absolute(model)) {
    fs::copy_file(o.tokenizer, model, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::NotFoundError(absl::StrCat("copy tokenizer ", o.tokenizer, ": ", ec.message()));
  }
  sp::Tokenizer tok;
  if (absl::Status s = FromSp(tok.Load(model), absl::StrCat("loading ", model)); !s.ok()) return s;
  PrepareResult r;
  r.vocab_size = tok.vocab_size();
  r.text_bytes = total;
  if (r.vocab_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", r.vocab_size, " pieces; uint16 tokens allow 65536"));
  }

  // The last val_fraction of the text (by bytes, at piece boundaries) becomes the validation split.
  const int64_t val_from = static_cast<int64_t>(static_cast<double>(total) * (1.0 - o.val_fraction));
  const std::string train_path = o.out_dir + "/train.bin", val_path = o.out_dir + "/val.bin";
  std::ofstream train(train_path, std::ios::binary | std::ios::trunc), val(val_path, std::ios::binary | std::ios::trunc);
  if (!train || !val) return absl::InternalError(absl::StrCat("cannot create token files in ", o.out_dir));
  TextPieces pieces(*files);
  std::string text;
  std::vector<int> ids;
  int64_t read = 0, next_report = 0;
  for (;;) {
    absl::StatusOr<bool> more = pieces.Next(&text);
    if (!more.ok()) return more.status();
    if (!*more) break;
    // The piece that crosses val_from is cut at the first line break from there on.
    size_t cut = text.size();
    if (read < val_from && read + static_cast<int64_t>(text.size()) > val_from) {
      const size_t nl = text.find('\n', static_cast<size_t>(val_from - read));
      cut = nl == std::string::npos ? text.size() : nl + 1;
    } else if (read >= val_from) {
      cut = 0;
    }
    read += static_cast<int64_t>(text.size());
    for (const bool to_val : {false, true}) {
      const std::string part = to_val ? text.substr(cut) : text.substr(0, cut);
      if (part.empty()) continue;
      if (absl::Status s = FromSp(tok.Encode(part, &ids), "tokenizing"); !s.ok()) return s;
      if (absl::Status s = WriteTokens(to_val ? val : train, ids, to_val ? val_path : train_path); !s.ok()) return s;
      (to_val ? r.val_tokens : r.train_tokens) += static_cast<int64_t>(ids.size());
    }
    if (read >= next_report) {
      say(absl::StrCat("tokenized ", read >> 20, " of ", total >> 20, " MiB"));
      next_report = read + (int64_t{64} << 20);
    }
  }
  train.close();
  val.close();
  if (train.fail() || val.fail()) return absl::InternalError(absl::StrCat("writing the token files in ", o.out_dir, " failed (disk full?)"));
  if (r.val_tokens == 0 || r.train_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the text (", total, " bytes) is too small to split into train and validation"));
  }
  nlohmann::json meta = {{"format", "tokens-u16"},       {"vocab_size", r.vocab_size},
                         {"train_tokens", r.train_tokens}, {"val_tokens", r.val_tokens},
                         {"tokenizer", "tokenizer.model"}, {"text_bytes", total}};
  std::ofstream meta_file(o.out_dir + "/meta.json", std::ios::trunc);
  meta_file << meta.dump(2) << "\n";
  meta_file.close();
  if (meta_file.fail()) return absl::InternalError(absl::StrCat("writing ", o.out_dir, "/meta.json failed"));
  say(absl::StrCat("wrote ", r.train_tokens, " train and ", r.val_tokens, " validation tokens (vocab ", r.vocab_size,
                   ") to ", o.out_dir));
  return r;
}

}  // namespace longhaul::stage_runtime
