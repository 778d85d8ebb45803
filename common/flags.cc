#include "common/flags.h"

#include <cstdio>
#include <vector>

namespace longhaul::common {
namespace {

// The command whose flags were parsed: "prog", or "prog sub" when a subcommand was given (`app`
// may be the program or one of its subcommands).
std::string CommandName(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* a = app.get_parent(); a != nullptr; a = a->get_parent()) name = a->get_name() + " " + name;
  for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
    a = a->get_subcommands().front();
    name += " " + a->get_name();
  }
  return name;
}

// For a program made of subcommands (require_subcommand) that got none: CLI11 says only "A
// subcommand is required", also when the command was misspelt.
std::string NoCommandMessage(const CLI::App& app) {
  std::string names;
  for (const CLI::App* c : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + c->get_name();
  }
  const std::vector<std::string> rest = app.remaining();
  if (rest.empty()) return "a command is needed: " + names;
  return "unknown command \"" + rest.front() + "\" (commands: " + names + ")";
}

}  // namespace

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and --help-all) arrive as "errors" with a success exit code; CLI11 prints the help
    // of the subcommand that was asked about.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && app.get_require_subcommand_min() > 0 &&
        app.get_subcommands().empty()) {
      return FlagError(app, NoCommandMessage(app));
    }
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
