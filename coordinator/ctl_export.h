// `longhaulctl export`: a job's stage checkpoints as one Hugging Face GPT-2 directory
// (coordinator/hf_export.h does the conversion; this file asks the coordinator for the job record
// and finds the files). Kept out of ctl_main.cc so that the CLI's main stays a list of commands.
//
//   ExportFlags f;
//   CLI::App* cmd = AddExportCommand(app, &f);
//   ... parse ...
//   if (cmd->parsed()) return RunExport(coordinator_address, f);
#ifndef LONGHAUL_COORDINATOR_CTL_EXPORT_H_
#define LONGHAUL_COORDINATOR_CTL_EXPORT_H_

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace longhaul::coordinator {

struct ExportFlags {
  uint64_t job = 0;
  std::string format = "hf";
  std::string out;
  std::string checkpoint_dir;  // empty: the paths in the job record
};

// Registers the `export` subcommand on `app`, writing its flags into `*flags`.
CLI::App* AddExportCommand(CLI::App& app, ExportFlags* flags);

// Runs it against the coordinator at `coordinator` (HOST:PORT); returns the exit status (0 on
// success, 1 with the reason on stderr otherwise).
int RunExport(const std::string& coordinator, const ExportFlags& flags);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_CTL_EXPORT_H_
