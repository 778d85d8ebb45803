#include "common/flags.h"

#include <cstdio>

namespace longhaul::common {
namespace {

// "prog" or, when a subcommand was given, "prog sub" (the command whose flags were parsed).
std::string CommandName(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
    a = a->get_subcommands().front();
    name += " " + a->get_name();
  }
  return name;
}

}  // namespace

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and --help-all) arrive as "errors" with a success exit code; CLI11 prints the help
    // of the subcommand that was asked about.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return FlagError(app, e.what());
  }
  return std::nullopt;
}

int FlagError(const CLI::App& app, const std::string& message) {
  const std::string name = CommandName(app);
  std::fprintf(stderr, "%s: %s\nRun `%s --help` for the flags.\n", name.c_str(), message.c_str(), name.c_str());
  return 2;
}

}  // namespace longhaul::common
