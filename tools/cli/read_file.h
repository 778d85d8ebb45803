// Reads a whole (small) file given on a command line, e.g. a job spec or a topology file.
//
//   absl::StatusOr<std::string> yaml = cli::ReadFile(path);   // "cannot read PATH: <errno text>"
#ifndef LONGHAUL_TOOLS_CLI_READ_FILE_H_
#define LONGHAUL_TOOLS_CLI_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace longhaul::cli {

absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace longhaul::cli

#endif  // LONGHAUL_TOOLS_CLI_READ_FILE_H_
