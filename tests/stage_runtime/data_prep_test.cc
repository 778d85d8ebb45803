// `longhaul-data prepare`'s engine: a SentencePiece BPE tokenizer trained on real text, token
// files in the tokens-u16 layout, an existing tokenizer reused, bad inputs named. Links neither
// LibTorch nor protobuf: Debian's libsentencepiece carries its own protobuf symbols, which clash
// with libprotobuf's in one process (data_prep.h).
#include "stage_runtime/data_prep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>


namespace longhaul::stage_runtime {
namespace {

inline constexpr char kDefaultCorpusDir[] = "/usr/share/games/fortunes";

std::vector<uint16_t> ReadTokens(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<uint16_t> t(bytes.size() / 2);
  std::memcpy(t.data(), bytes.data(), t.size() * 2);
  return t;
}

std::string Fresh(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/prep-" + name;
  std::filesystem::remove_all(d);
  return d;
}

TEST(DataPrep, TrainsATokenizerAndWritesTokenFilesTheRuntimeReads) {
  PrepareOptions o;
  o.inputs = {kDefaultCorpusDir};
  o.out_dir = Fresh("fortunes");
  o.vocab_size = 1000;
  o.val_fraction = 0.1;
  std::vector<std::string> lines;
  o.progress = [&](const std::string& s) { lines.push_back(s); };
  absl::StatusOr<PrepareResult> r = PrepareTokenData(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->vocab_size, 1000);
  EXPECT_GT(r->train_tokens, 8 * r->val_tokens / 2);  // ~9:1 by bytes
  EXPECT_LT(r->train_tokens, r->text_bytes / 2);      // BPE: well under a token per byte
  EXPECT_FALSE(lines.empty());
  for (const char* f : {"/train.bin", "/val.bin", "/tokenizer.model", "/meta.json"}) {
    EXPECT_TRUE(std::filesystem::exists(o.out_dir + f)) << f;
  }
  const std::vector<uint16_t> train = ReadTokens(o.out_dir + "/train.bin");
  ASSERT_EQ(static_cast<int64_t>(train.size()), r->train_tokens);
  EXPECT_LT(*std::max_element(train.begin(), train.end()), r->vocab_size);
  EXPECT_GT(*std::max_element(train.begin(), train.end()), r->vocab_size / 2);  // the vocab is used
  EXPECT_EQ(static_cast<int64_t>(ReadTokens(o.out_dir + "/val.bin").size()), r->val_tokens);

  // The same tokenizer again, on one file: same vocab, no training.
  PrepareOptions again;
  again.inputs = {kDefaultCorpusDir + std::string("/fortunes")};
  again.out_dir = Fresh("reuse");
  again.tokenizer = o.out_dir + "/tokenizer.model";
  absl::StatusOr<PrepareResult> r2 = PrepareTokenData(again);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->vocab_size, 1000);
}

TEST(DataPrep, BadInputsAreNamed) {
  PrepareOptions o;
  o.out_dir = Fresh("bad");
  o.inputs = {"/no/such/corpus"};
  absl::StatusOr<PrepareResult> r = PrepareTokenData(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/no/such/corpus"), std::string::npos) << r.status();
  o.inputs = {kDefaultCorpusDir};
  o.vocab_size = 100000;
  EXPECT_FALSE(PrepareTokenData(o).ok());
  o.vocab_size = 1000;
  o.val_fraction = 0.9;
  EXPECT_FALSE(PrepareTokenData(o).ok());
  o.val_fraction = 0.1;
  o.tokenizer = "/no/such/tokenizer.model";
  EXPECT_FALSE(PrepareTokenData(o).ok());
}

}  // namespace
}  // namespace longhaul::stage_runtime
