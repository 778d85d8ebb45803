// Clean shutdown on SIGTERM / SIGINT for the daemons.
//
//   cli::InstallTerminationHandlers();            // first thing in main
//   std::thread([&] { int sig = cli::WaitForTerminationSignal(); daemon->Shutdown(); }).detach();
//
// A handler (not a blocked mask + sigwait) because libraries loaded before main — OpenBLAS and
// OpenMP pools in LibTorch — start threads that would not inherit a mask, and the kernel may
// deliver the signal to any of them. The handler only writes the signal number to a pipe.
#ifndef LONGHAUL_TOOLS_CLI_SIGNALS_H_
#define LONGHAUL_TOOLS_CLI_SIGNALS_H_

namespace longhaul::cli {

// Returns false if the pipe or the handlers could not be set up.
bool InstallTerminationHandlers();
// Blocks until SIGTERM or SIGINT arrives; returns the signal number.
int WaitForTerminationSignal();
const char* SignalName(int sig);

}  // namespace longhaul::cli

#endif  // LONGHAUL_TOOLS_CLI_SIGNALS_H_
