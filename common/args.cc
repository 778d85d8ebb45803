#include "common/args.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace longhaul::common {

absl::StatusOr<Args> Args::Parse(int argc, char** argv, const std::set<std::string>& known,
                                 bool allow_positional) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0 && allow_positional) {
      a.positional_.push_back(s);
      continue;
    }
    if (s.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", s, "\" (flags are --name=value)"));
    }
    s = s.substr(2);
    const size_t eq = s.find('=');
    std::string k = s.substr(0, eq), v = eq == std::string::npos ? "true" : s.substr(eq + 1);
    if (!known.count(k)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", k));
    a.values_[k].push_back(v);
  }
  return a;
}

std::string Args::Str(const std::string& k, const std::string& def) const {
  auto it = values_.find(k);
  return it == values_.end() ? def : it->second.back();
}

std::vector<std::string> Args::Values(const std::string& k) const {
  auto it = values_.find(k);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> Args::Int(const std::string& k, int64_t def) const {
  if (!Has(k)) return def;
  int64_t v;
  if (!absl::SimpleAtoi(Str(k, ""), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", k, " needs an integer, got \"", Str(k, ""), "\""));
  }
  return v;
}

absl::StatusOr<double> Args::Double(const std::string& k, double def) const {
  if (!Has(k)) return def;
  double v;
  if (!absl::SimpleAtod(Str(k, ""), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", k, " needs a number, got \"", Str(k, ""), "\""));
  }
  return v;
}

bool Args::Bool(const std::string& k) const {
  const std::string v = Str(k, "false");
  return v == "true" || v == "1" || v == "yes";
}

std::optional<int> ExitForParseErrorOrHelp(const absl::StatusOr<Args>& args, const char* program, const char* usage) {
  if (!args.ok()) {
    std::fprintf(stderr, "%s: %s\n\n%s", program, std::string(args.status().message()).c_str(), usage);
    return 2;
  }
  if (args->Bool("help")) {
    std::fputs(usage, stdout);
    return 0;
  }
  return std::nullopt;
}

}  // namespace longhaul::common
