// Data formats: byte-level text from a directory or one file, and memory-mapped uint16 token files
// with every token checked against the vocab.
#include "stage_runtime/data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace longhaul::stage_runtime {
namespace {

std::string Dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/data-test-" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

void WriteTokens(const std::string& path, const std::vector<uint16_t>& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
}

std::vector<uint16_t> Ramp(int n, int vocab) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % vocab);
  return t;
}

TEST(TokenFileDataset, SamplesConsecutiveTokensWithShiftedLabels) {
  const std::string d = Dir("ok");
  WriteTokens(d + "/train.bin", Ramp(5000, 1000));
  WriteTokens(d + "/val.bin", Ramp(600, 1000));
  auto ds = OpenDataset({"tokens-u16", d, 1000}, 16);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->train_tokens(), 5000);
  EXPECT_EQ((*ds)->val_tokens(), 600);
  const Batch b = (*ds)->Sample(Split::kTrain, 1, 3, 0, 4, 16);
  ASSERT_EQ(b.tokens.sizes(), (std::vector<int64_t>{4, 16}));
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(b.labels[r][t].item<int64_t>(), (b.tokens[r][t].item<int64_t>() + 1) % 1000);
    }
  }
  // Reproducible from (seed, step, micro-batch); different for another micro-batch.
  EXPECT_TRUE(torch::equal((*ds)->Sample(Split::kTrain, 1, 3, 0, 4, 16).tokens, b.tokens));
  EXPECT_FALSE(torch::equal((*ds)->Sample(Split::kTrain, 1, 3, 1, 4, 16).tokens, b.tokens));
  EXPECT_LT((*ds)->Sample(Split::kValidation, 1, 3, 0, 4, 16).tokens.max().item<int64_t>(), 1000);
}

TEST(TokenFileDataset, ATokenOutsideTheVocabIsNamedWithFileAndOffset) {
  const std::string d = Dir("bad-token");
  std::vector<uint16_t> t = Ramp(3000, 100);
  t[1234] = 100;
  WriteTokens(d + "/train.bin", t);
  WriteTokens(d + "/val.bin", Ramp(300, 100));
  auto ds = OpenDataset({"tokens-u16", d, 100}, 16);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("train.bin"), std::string::npos) << ds.status();
  EXPECT_NE(ds.status().message().find("offset 1234"), std::string::npos) << ds.status();
}

TEST(TokenFileDataset, MalformedFilesAreRejected) {
  const std::string d = Dir("malformed");
  WriteTokens(d + "/train.bin", Ramp(3000, 100));
  {
    auto ds = OpenDataset({"tokens-u16", d, 100}, 16);  // no val.bin
    ASSERT_FALSE(ds.ok());
    EXPECT_NE(ds.status().message().find("val.bin"), std::string::npos) << ds.status();
  }
  WriteTokens(d + "/val.bin", Ramp(10, 100));  // shorter than one sequence
  EXPECT_FALSE(OpenDataset({"tokens-u16", d, 100}, 16).ok());
  {
    std::ofstream f(d + "/val.bin", std::ios::binary);
    f.write("abcde", 5);  // odd number of bytes
  }
  auto ds = OpenDataset({"tokens-u16", d, 100}, 16);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("whole number"), std::string::npos) << ds.status();
  EXPECT_FALSE(OpenDataset({"tokens-u16", d, 70000}, 16).ok());  // no uint16 vocab is that large
  EXPECT_FALSE(OpenDataset({"parquet", d, 100}, 16).ok());
}

TEST(TextDataset, ASingleFileIsACorpus) {
  const std::string d = Dir("text");
  {
    std::ofstream f(d + "/book.txt");
    for (int i = 0; i < 400; ++i) f << "line " << i << " of a corpus that is one file\n";
  }
  auto ds = OpenDataset({"text", d + "/book.txt", 256}, 32);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_GT((*ds)->train_tokens(), 10000);
  auto missing = OpenDataset({"text", d + "/nope.txt", 256}, 32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);
  EXPECT_FALSE(OpenDataset({"text", d, 100}, 32).ok());  // bytes need vocab >= 256
}

}  // namespace
}  // namespace longhaul::stage_runtime
