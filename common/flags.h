// Command-line flags for longhaul's executables, on CLI11: each program declares every flag once
// (name, help text, default) on a CLI::App, and these helpers give all of them the same behaviour:
// --help prints the generated help on stdout (exit status 0); a bad flag prints
// "program: problem" and a hint to use --help on stderr (exit status 2).
//
//   CLI::App app{"What the program does.", "longhaul-worker"};
//   app.option_defaults()->always_capture_default();  // defaults shown in --help
//   app.add_option("--listen", o.listen, "data-plane listen address")->type_name("HOST:PORT");
//   if (std::optional<int> rc = common::ParseFlags(app, argc, argv)) return *rc;
//   if (threads < 0) return common::FlagError(app, "--threads needs a non-negative integer");
#ifndef LONGHAUL_COMMON_FLAGS_H_
#define LONGHAUL_COMMON_FLAGS_H_

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace longhaul::common {

// Parses argv (argv[0] is the program) into `app` and its subcommands. Returns the status main
// should exit with (0 after --help, 2 after a parse error, both already reported), or nullopt to go
// on with the parsed values.
std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv);

// For checks CLI11 cannot express (relations between flags, ...): reports `message` like a parse
// error of the command that was parsed (e.g. "longhaulctl submit: ...") and returns 2.
int FlagError(const CLI::App& app, const std::string& message);

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_FLAGS_H_
