// Clean shutdown on SIGTERM / SIGINT for the daemons.
//
//   common::InstallTerminationHandlers();            // first thing in main
//   std::thread([&] { int sig = common::WaitForTerminationSignal(); daemon->Shutdown(); }).detach();
//
// A handler (not a blocked mask + sigwait) because libraries loaded before main — OpenBLAS and
// OpenMP pools in LibTorch — start threads that would not inherit a mask, and the kernel may
// deliver the signal to any of them. The handler only writes the signal number to a pipe.
#ifndef LONGHAUL_COMMON_SIGNALS_H_
#define LONGHAUL_COMMON_SIGNALS_H_

namespace longhaul::common {

// Returns false if the pipe or the handlers could not be set up.
bool InstallTerminationHandlers();
// On a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints the signal and a symbolised stack
// trace to stderr before dying (Abseil's failure signal handler), so a crash on a remote machine
// says where it happened. SIGTERM keeps its disposition (InstallTerminationHandlers owns it).
// Call first thing in main, with argv[0].
void InstallCrashHandler(const char* argv0);
// Blocks until SIGTERM or SIGINT arrives; returns the signal number.
int WaitForTerminationSignal();
const char* SignalName(int sig);

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_SIGNALS_H_
