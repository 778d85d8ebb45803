// Paths a job spec names on a worker's disk (docs/security.md, "Hostile input"): a spec is written
// by whoever may submit jobs, the worker's disk belongs to its operator. `checkpoint.dir` and
// `data.corpus` must resolve inside the worker's data directory (for the corpus also the built-in
// default corpus) or a directory its operator allows (`longhaul-worker --allow-paths`).
#ifndef LONGHAUL_WORKER_SPEC_PATHS_H_
#define LONGHAUL_WORKER_SPEC_PATHS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::worker {

// `path` resolved -- symbolic links followed, "." and ".." collapsed (realpath) -- when it lies
// inside one of `roots`; PERMISSION_DENIED naming `what`, the path and the roots otherwise. A path
// that does not exist yet (a checkpoint directory to create) is resolved through its deepest
// existing ancestor, and what follows it may not climb back out with "..".
absl::StatusOr<std::string> CheckSpecPath(const char* what, const std::string& path,
                                          const std::vector<std::string>& roots);

// A text corpus is read into memory whole: one larger than this is refused.
inline constexpr int64_t kMaxTextCorpusBytes = int64_t{4} << 30;
// RESOURCE_EXHAUSTED when the regular files of the text corpus at `path` (a file, or the files
// directly in a directory, as stage_runtime::OpenDataset reads them) exceed kMaxTextCorpusBytes.
absl::Status CheckCorpusSize(const std::string& path);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_SPEC_PATHS_H_
