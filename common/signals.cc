#include "common/signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"

namespace longhaul::common {
namespace {

int g_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!write(g_pipe[1], &b, 1);  // async-signal-safe; a full pipe just drops repeats
  errno = saved;
}

}  // namespace

bool InstallTerminationHandlers() {
  if (pipe2(g_pipe, O_CLOEXEC) != 0) return false;
  fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0;
}

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  // Abseil's handler also takes SIGTERM; keep what it was (default, or ours if already installed).
  struct sigaction term = {};
  sigaction(SIGTERM, nullptr, &term);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions{});
  sigaction(SIGTERM, &term, nullptr);
}

int WaitForTerminationSignal() {
  unsigned char b = 0;
  for (;;) {
    const ssize_t n = read(g_pipe[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    return SIGTERM;  // the pipe broke: treat as a request to stop
  }
}

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal"; }

}  // namespace longhaul::common
