#include "common/list_dir.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
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

}  // namespace longhaul::common
