// A job spec's paths on a worker's disk (worker/spec_paths.h, docs/security.md "Hostile input"):
// whoever may submit jobs must not make a worker write its checkpoints anywhere or read any
// directory as its corpus.
#include "worker/spec_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace longhaul::worker {
namespace {

class SpecPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") + "/spec-paths-XXXXXX";
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    char* r = realpath(t.c_str(), nullptr);
    root_ = r;
    std::free(r);
    data_ = root_ + "/data";
    ASSERT_EQ(mkdir(data_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir((data_ + "/ckpt").c_str(), 0700), 0);
  }
  void TearDown() override { ASSERT_EQ(std::system(absl::StrCat("rm -rf '", root_, "'").c_str()), 0); }
  std::string root_, data_;
};

TEST_F(SpecPathsTest, InsideTheDataDirectoryIsResolvedAndNewDirectoriesAreAllowed) {
  absl::StatusOr<std::string> p = CheckSpecPath("checkpoint.dir", data_ + "/ckpt/./", {data_});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, data_ + "/ckpt");
  p = CheckSpecPath("checkpoint.dir", data_ + "/not/yet/made", {data_});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, data_ + "/not/yet/made");
  EXPECT_TRUE(CheckSpecPath("checkpoint.dir", data_, {data_}).ok());
}

TEST_F(SpecPathsTest, OutsideClimbingOutOrThroughALinkIsRefusedNamingThePath) {
  absl::StatusOr<std::string> p = CheckSpecPath("data.corpus", "/etc", {data_});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(p.status().message().find("data.corpus \"/etc\" is refused"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("--allow-paths"), std::string::npos) << p.status();
  // ".." out of the data directory, through an existing and a missing directory.
  EXPECT_FALSE(CheckSpecPath("checkpoint.dir", data_ + "/ckpt/../../elsewhere", {data_}).ok());
  EXPECT_FALSE(CheckSpecPath("checkpoint.dir", data_ + "/missing/../../../etc", {data_}).ok());
  // A prefix of the name is not the directory: /x/data-other is not inside /x/data.
  ASSERT_EQ(mkdir((root_ + "/data-other").c_str(), 0700), 0);
  EXPECT_FALSE(CheckSpecPath("checkpoint.dir", root_ + "/data-other", {data_}).ok());
  // A symbolic link inside the data directory that points out of it.
  ASSERT_EQ(symlink("/etc", (data_ + "/link").c_str()), 0);
  p = CheckSpecPath("data.corpus", data_ + "/link", {data_});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("resolves to /etc"), std::string::npos) << p.status();
  EXPECT_FALSE(CheckSpecPath("checkpoint.dir", "relative/dir", {data_}).ok());
  EXPECT_FALSE(CheckSpecPath("checkpoint.dir", "", {data_}).ok());
}

TEST_F(SpecPathsTest, TheOperatorsAllowListAddsDirectories) {
  ASSERT_EQ(mkdir((root_ + "/shared").c_str(), 0700), 0);
  EXPECT_FALSE(CheckSpecPath("data.corpus", root_ + "/shared", {data_}).ok());
  EXPECT_TRUE(CheckSpecPath("data.corpus", root_ + "/shared", {data_, root_ + "/shared"}).ok());
  // A root that does not exist allows nothing.
  EXPECT_FALSE(CheckSpecPath("data.corpus", "/etc", {data_, "/no/such/root"}).ok());
}

TEST_F(SpecPathsTest, ACorpusLargerThanTheLimitIsRefusedBeforeItIsRead) {
  const std::string corpus = data_ + "/corpus";
  ASSERT_EQ(mkdir(corpus.c_str(), 0700), 0);
  std::ofstream(corpus + "/a.txt") << "small";
  EXPECT_TRUE(CheckCorpusSize(corpus).ok());
  // A sparse file: its size counts, without writing 4 GiB.
  std::ofstream(corpus + "/big.txt").close();
  ASSERT_EQ(truncate((corpus + "/big.txt").c_str(), kMaxTextCorpusBytes), 0);
  absl::Status s = CheckCorpusSize(corpus);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("holds"), std::string::npos) << s;
  EXPECT_TRUE(CheckCorpusSize(data_ + "/missing").ok());  // the dataset's own error says what is wrong
}

}  // namespace
}  // namespace longhaul::worker
