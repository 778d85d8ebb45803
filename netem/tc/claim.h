// NetworkClaim: one process's exclusive use of a topology's name (network.h) while it runs a network
// it built for itself (the bandwidth sweep, an integration test).
//
// Such a process removes an interrupted run's leftovers (Network::Down) before its own Up, and
// its own namespaces when it ends. Two of them with the same name would remove each other's
// namespaces under running processes: a sweep started while another still runs, or while a
// stopped one is still cleaning up. So each claims the name first, and keeps the claim until it has
// removed its own: an advisory lock (flock) on a file of the lock directory (/run/lock, else /tmp),
// holding its pid, which the kernel releases when the process ends however it ends (a killed
// run's leftovers can then be removed; a killed sweep's workers may outlive it, and the next run
// removes their namespaces as it always did). `longhaul-netem up|down` claim the name while they
// run, so they refuse one that a sweep holds. The lock directory is every user's: a lock file that
// is a link, or another user's, is refused rather than opened.
//
// Threading: a claim is owned by one thread; Holder may be called from any.
#ifndef LONGHAUL_NETEM_TC_CLAIM_H_
#define LONGHAUL_NETEM_TC_CLAIM_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace longhaul::netem {

class NetworkClaim {
 public:
  // Claims `name`, waiting up to `patience` while another process holds it (`waiting`, if given,
  // is called once with that process's pid when the wait begins). After that, an error naming it.
  static absl::StatusOr<NetworkClaim> Acquire(const std::string& name, absl::Duration patience,
                                              const std::function<void(int64_t pid)>& waiting = nullptr);
  // The pid of the process that claims `name` (0 if it wrote none yet), or nullopt when none does.
  // It takes a shared lock for an instant: a claim tried at that instant without patience fails.
  static absl::StatusOr<std::optional<int64_t>> Holder(const std::string& name);
  // The lock file of `name`.
  static std::string LockPath(const std::string& name);

  NetworkClaim(NetworkClaim&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  NetworkClaim& operator=(NetworkClaim&& o) noexcept;
  NetworkClaim(const NetworkClaim&) = delete;
  NetworkClaim& operator=(const NetworkClaim&) = delete;
  ~NetworkClaim();

 private:
  explicit NetworkClaim(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace longhaul::netem

#endif  // LONGHAUL_NETEM_TC_CLAIM_H_
