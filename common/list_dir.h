// Lists and removes directories with POSIX calls (opendir/readdir, nftw).
//
//   absl::StatusOr<std::vector<common::DirEntry>> es = common::ListDirectory("/data/corpus");
//   for (const common::DirEntry& e : *es) if (e.kind == common::DirEntry::kFile) ...
//
// Why not std::filesystem::directory_iterator: the PyTorch wheels' libtorch_cpu.so exports its own
// statically linked copy of libstdc++'s std::filesystem (pytorch/pytorch#133437). A binary that
// links that LibTorch and iterates a directory gets the wheel's out-of-line iterator functions
// together with its own compiler's inline ones (and libstdc++'s own remove_all calls the wheel's
// iterator through the PLT), and they disagree on the iterator's layout: on the GPU machine
// (LibTorch 2.11 wheel, gcc 13) longhaul-bench sweep crashed freeing a job's checkpoints. Code that
// links LibTorch lists and removes directory trees through this instead.
#ifndef LONGHAUL_COMMON_LIST_DIR_H_
#define LONGHAUL_COMMON_LIST_DIR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul::common {

struct DirEntry {
  enum Kind { kFile, kDirectory, kOther };  // kOther: symbolic links (not followed), devices, ...
  std::string name;                         // the name within the directory
  std::string path;                         // dir + "/" + name
  Kind kind = kOther;
};

// The entries of `dir` but "." and "..", sorted by name.
absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir);

// The paths of the regular files directly in `dir` (symbolic links skipped) whose names do not
// end in `skip_suffix` (when not empty), sorted.
absl::StatusOr<std::vector<std::string>> ListRegularFiles(const std::string& dir, absl::string_view skip_suffix = "");

// Removes `path` and, if it is a directory, everything under it (symbolic links are removed, not
// followed). A path that does not exist is not an error.
absl::Status RemoveTree(const std::string& path);

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_LIST_DIR_H_
