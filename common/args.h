// Minimal --key=value argument parsing for longhaul's executables (daemons, CLI, benchmarks), with
// clear errors for unknown or malformed flags. Repeated flags are kept in order (Values()).
// Arguments that do not start with "--" are positional (Positional()), allowed only when asked for.
#ifndef LONGHAUL_COMMON_ARGS_H_
#define LONGHAUL_COMMON_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul::common {

class Args {
 public:
  // `known` lists accepted flag names (without "--"); "--flag" alone means "--flag=true".
  static absl::StatusOr<Args> Parse(int argc, char** argv, const std::set<std::string>& known,
                                    bool allow_positional = false);

  bool Has(const std::string& k) const { return values_.count(k) > 0; }
  std::string Str(const std::string& k, const std::string& def) const;
  std::vector<std::string> Values(const std::string& k) const;
  absl::StatusOr<int64_t> Int(const std::string& k, int64_t def) const;
  absl::StatusOr<double> Double(const std::string& k, double def) const;
  bool Bool(const std::string& k) const;
  const std::vector<std::string>& Positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// Every executable's start: on a parse error prints "program: error" and the usage to stderr
// (exit status 2); on --help prints the usage to stdout (exit status 0). Returns the status main
// should exit with, or nullopt to go on.
std::optional<int> ExitForParseErrorOrHelp(const absl::StatusOr<Args>& args, const char* program, const char* usage);

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_ARGS_H_
