// One-line log records on stderr for the daemons: "2026-11-22T14:03:05.123Z worker w0: message"
// (time in UTC). Warnings and errors say so after the name, so they can be found with grep:
// "2026-11-22T14:03:05.123Z coordinator: error: cannot persist job: disk full".
// Thread-safe (one fprintf per record).
//
// Not spdlog: one sink (stderr, which the supervisor or a script redirects), three levels and a
// fixed line format are all the daemons need; this header does that with no library to link.
#ifndef LONGHAUL_COMMON_LOG_H_
#define LONGHAUL_COMMON_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace longhaul::common {

enum class LogLevel { kInfo, kWarning, kError };

inline void Log(LogLevel level, absl::string_view who, absl::string_view msg) {
  const std::string t = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  const char* tag = level == LogLevel::kError ? "error: " : level == LogLevel::kWarning ? "warning: " : "";
  std::fprintf(stderr, "%s %.*s: %s%.*s\n", t.c_str(), static_cast<int>(who.size()), who.data(), tag,
               static_cast<int>(msg.size()), msg.data());
}

// Progress and state changes.
inline void Log(absl::string_view who, absl::string_view msg) { Log(LogLevel::kInfo, who, msg); }
// Something went wrong and is being retried or worked around (a lost connection, a retry).
inline void LogWarning(absl::string_view who, absl::string_view msg) { Log(LogLevel::kWarning, who, msg); }
// Something failed for good (a job, a write to the state file).
inline void LogError(absl::string_view who, absl::string_view msg) { Log(LogLevel::kError, who, msg); }

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_LOG_H_
