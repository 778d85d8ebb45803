// Reads a whole (small) file given on a command line, e.g. a job spec or a topology file.
//
//   absl::StatusOr<std::string> yaml = common::ReadFile(path);   // "cannot read PATH: <errno text>"
#ifndef LONGHAUL_COMMON_READ_FILE_H_
#define LONGHAUL_COMMON_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace longhaul::common {

absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_READ_FILE_H_
