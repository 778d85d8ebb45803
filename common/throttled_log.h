// Warnings about refused requests that a hostile or broken client can repeat at will (a forged
// stream, a wrong certificate, a limit hit), logged so that a flood does not flood the log: the
// first for a key, then at most one per `every` for that key, saying how many were not logged in
// between. Keys are what the operator wants told apart (the peer's host, the RPC); at most
// kMaxKeys are tracked, later ones share one key, so memory stays bounded whatever the peers.
//
//   common::ThrottledLog refusals("worker w0");
//   refusals.Warn(peer_host, absl::StrCat("refused a stream of job 7 from ", peer_host, ": ..."));
//   -> "... worker w0: warning: refused a stream of job 7 from 10.0.0.9: ... (3 more since the last report)"
//
// Thread-safe.
#ifndef LONGHAUL_COMMON_THROTTLED_LOG_H_
#define LONGHAUL_COMMON_THROTTLED_LOG_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace longhaul::common {

class ThrottledLog {
 public:
  static constexpr size_t kMaxKeys = 1024;
  explicit ThrottledLog(std::string who, absl::Duration every = absl::Seconds(10), Clock* clock = RealClock())
      : who_(std::move(who)), every_(every), clock_(clock) {}

  // Logs `msg` as a warning unless `key` was logged less than `every` ago; returns whether it did.
  bool Warn(const std::string& key, const std::string& msg);

 private:
  struct Entry {
    absl::Time logged = absl::InfinitePast();
    int64_t suppressed = 0;
  };
  const std::string who_;
  const absl::Duration every_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, Entry> keys_ ABSL_GUARDED_BY(mu_);
  absl::Time swept_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_THROTTLED_LOG_H_
