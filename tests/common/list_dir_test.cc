#include "common/list_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace longhaul::common {
namespace {

bool Exists(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

class ListDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/list-dir-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    outside_ = root_ + "-outside";
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    std::ofstream(outside_ + "/keep") << "x";
    std::ofstream(root_ + "/b.txt") << "b";
    std::ofstream(root_ + "/a.txt") << "a";
    std::ofstream(root_ + "/cache.dat") << "d";
    ASSERT_EQ(mkdir((root_ + "/sub").c_str(), 0755), 0);
    std::ofstream(root_ + "/sub/deep") << "z";
    ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/link").c_str()), 0);
  }
  void TearDown() override {
    (void)RemoveTree(root_);
    (void)RemoveTree(outside_);
  }
  std::string root_, outside_;
};

TEST_F(ListDirTest, ListsSortedWithKinds) {
  absl::StatusOr<std::vector<DirEntry>> es = ListDirectory(root_);
  ASSERT_TRUE(es.ok()) << es.status();
  ASSERT_EQ(es->size(), 5u);
  EXPECT_EQ((*es)[0].name, "a.txt");
  EXPECT_EQ((*es)[0].path, root_ + "/a.txt");
  EXPECT_EQ((*es)[0].kind, DirEntry::kFile);
  EXPECT_EQ((*es)[3].name, "link");
  EXPECT_EQ((*es)[3].kind, DirEntry::kOther);  // a link to a directory is not followed
  EXPECT_EQ((*es)[4].name, "sub");
  EXPECT_EQ((*es)[4].kind, DirEntry::kDirectory);
}

TEST_F(ListDirTest, RegularFilesSkipLinksDirectoriesAndTheSuffix) {
  absl::StatusOr<std::vector<std::string>> fs = ListRegularFiles(root_, ".dat");
  ASSERT_TRUE(fs.ok()) << fs.status();
  EXPECT_EQ(*fs, (std::vector<std::string>{root_ + "/a.txt", root_ + "/b.txt"}));
  EXPECT_EQ(ListRegularFiles(root_)->size(), 3u);
}

TEST_F(ListDirTest, MissingDirectoryIsAnErrorNamingIt) {
  absl::StatusOr<std::vector<DirEntry>> es = ListDirectory(root_ + "/nope");
  ASSERT_FALSE(es.ok());
  EXPECT_NE(es.status().message().find(root_ + "/nope"), std::string::npos) << es.status();
}

TEST_F(ListDirTest, RemoveTreeRemovesEverythingButWhatLinksPointTo) {
  ASSERT_TRUE(RemoveTree(root_).ok());
  EXPECT_FALSE(Exists(root_));
  EXPECT_TRUE(Exists(outside_ + "/keep"));
  EXPECT_TRUE(RemoveTree(root_).ok());  // already gone: not an error
}

}  // namespace
}  // namespace longhaul::common
