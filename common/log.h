// One-line log records on stderr for the daemons: "2026-11-22T14:03:05.123Z worker w0: message".
// Thread-safe (one fprintf per record).
#ifndef LONGHAUL_COMMON_LOG_H_
#define LONGHAUL_COMMON_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace longhaul::common {

inline void Log(absl::string_view who, absl::string_view msg) {
  const std::string t = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::fprintf(stderr, "%s %.*s: %.*s\n", t.c_str(), static_cast<int>(who.size()), who.data(),
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_LOG_H_
