#include "common/list_dir.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace longhaul::common {

absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", std::strerror(errno)));
  std::vector<DirEntry> out;
  errno = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    DirEntry de;
    de.name = name;
    de.path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (lstat(de.path.c_str(), &st) == 0) {
      de.kind = S_ISREG(st.st_mode) ? DirEntry::kFile : S_ISDIR(st.st_mode) ? DirEntry::kDirectory : DirEntry::kOther;
    }
    out.push_back(std::move(de));
    errno = 0;
  }
  const int err = errno;
  closedir(d);
  if (err != 0) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", std::strerror(err)));
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::vector<std::string>> ListRegularFiles(const std::string& dir, absl::string_view skip_suffix) {
  absl::StatusOr<std::vector<DirEntry>> es = ListDirectory(dir);
  if (!es.ok()) return es.status();
  std::vector<std::string> files;
  for (const DirEntry& e : *es) {
    if (e.kind != DirEntry::kFile || (!skip_suffix.empty() && absl::EndsWith(e.name, skip_suffix))) continue;
    files.push_back(e.path);
  }
  return files;
}

namespace {
int RemoveOne(const char* path, const struct stat*, int, struct FTW*) { return std::remove(path) == 0 ? 0 : errno; }
}  // namespace

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  // Depth first (contents before their directory), not following links; 16 open directories at most.
  const int rc = nftw(path.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", std::strerror(rc > 0 ? rc : errno)));
  return absl::OkStatus();
}

}  // namespace longhaul::common
