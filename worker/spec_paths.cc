#include "worker/spec_paths.h"

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/list_dir.h"

namespace longhaul::worker {

absl::StatusOr<std::string> CheckSpecPath(const char* what, const std::string& path,
                                          const std::vector<std::string>& roots) {
  auto refuse = [&](const std::string& why) {
    return absl::PermissionDeniedError(absl::StrCat(what, " \"", path, "\" is refused: ", why, "; allowed: ",
                                                    absl::StrJoin(roots, ", "),
                                                    " (the worker's --allow-paths adds directories)"));
  };
  if (path.empty() || path[0] != '/') return refuse("not an absolute path");
  std::string existing = path, rest;
  for (;;) {
    if (char* r = ::realpath(existing.c_str(), nullptr)) {
      existing = r;
      std::free(r);
      break;
    }
    const size_t slash = existing.find_last_of('/');
    if (slash == std::string::npos || existing == "/") return refuse("it cannot be resolved");
    const std::string last = existing.substr(slash + 1);
    if (last == "..") return refuse("\"..\" after a directory that does not exist");
    rest = last.empty() || last == "." ? rest : rest.empty() ? last : absl::StrCat(last, "/", rest);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  const std::string resolved = rest.empty() ? existing : absl::StrCat(existing == "/" ? "" : existing, "/", rest);
  for (const std::string& root : roots) {
    char* r = ::realpath(root.c_str(), nullptr);
    if (r == nullptr) continue;
    const std::string rr = r;
    std::free(r);
    if (resolved == rr || absl::StartsWith(resolved, rr == "/" ? rr : absl::StrCat(rr, "/"))) return resolved;
  }
  return refuse(resolved == path ? "outside the allowed directories" : absl::StrCat("it resolves to ", resolved, ", outside the allowed directories"));
}

absl::Status CheckCorpusSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();  // OpenDataset says what is wrong
  int64_t total = S_ISREG(st.st_mode) ? st.st_size : 0;
  if (S_ISDIR(st.st_mode)) {
    absl::StatusOr<std::vector<std::string>> files = common::ListRegularFiles(path);
    if (!files.ok()) return absl::OkStatus();
    for (const std::string& f : *files) {
      if (::stat(f.c_str(), &st) == 0) total += st.st_size;
    }
  }
  if (total > kMaxTextCorpusBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("data.corpus ", path, " holds ", total, " bytes of text; the limit is ",
                                                     kMaxTextCorpusBytes, " (prepare token files for large corpora: longhaul-data prepare)"));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::worker
