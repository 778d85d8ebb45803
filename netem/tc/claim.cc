#include "netem/tc/claim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace longhaul::netem {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// The pid its holder wrote into the lock file (0 if none yet, or unreadable).
int64_t WrittenPid(int fd) {
  char buf[32];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  int64_t pid = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, static_cast<size_t>(n))), &pid) ? pid : 0;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("network name \"", name, "\" cannot name a lock file"));
  }
  return absl::OkStatus();
}

std::string HeldBy(const std::string& name, int64_t pid) {
  return absl::StrCat("network \"", name, "\" is in use by ", pid > 0 ? absl::StrCat("process ", pid) : "another process",
                      " (a sweep or test that built it for its own run; lock file ", NetworkClaim::LockPath(name), ")");
}

}  // namespace

std::string NetworkClaim::LockPath(const std::string& name) {
  static const std::string dir = access("/run/lock", W_OK | X_OK) == 0 ? "/run/lock" : "/tmp";
  return absl::StrCat(dir, "/longhaul-netem-", name, ".lock");
}

absl::StatusOr<NetworkClaim> NetworkClaim::Acquire(const std::string& name, absl::Duration patience,
                                                   const std::function<void(int64_t pid)>& waiting) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  const std::string path = LockPath(name);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open the lock file", path);
  NetworkClaim claim(fd);  // closes it on every return below but the last
  const absl::Time give_up = absl::Now() + patience;
  bool told = false;
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK) return Errno("lock", path);
    const int64_t pid = WrittenPid(fd);
    if (absl::Now() >= give_up) return absl::FailedPreconditionError(HeldBy(name, pid));
    if (!told && waiting) waiting(pid);
    told = true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const std::string mine = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    return Errno("write the pid into", path);
  }
  return claim;
}

absl::StatusOr<std::optional<int64_t>> NetworkClaim::Holder(const std::string& name) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  const std::string path = LockPath(name);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<int64_t>();
    return Errno("open the lock file", path);
  }
  std::optional<int64_t> holder;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      absl::Status s = Errno("lock", path);
      close(fd);
      return s;
    }
    holder = WrittenPid(fd);
  }
  close(fd);  // and with it the shared lock, if it got one
  return holder;
}

absl::Status NetworkClaim::CheckUnclaimed(const std::string& name) {
  absl::StatusOr<std::optional<int64_t>> holder = Holder(name);
  if (!holder.ok()) return holder.status();
  return holder->has_value() ? absl::FailedPreconditionError(HeldBy(name, **holder)) : absl::OkStatus();
}

NetworkClaim& NetworkClaim::operator=(NetworkClaim&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

NetworkClaim::~NetworkClaim() {
  if (fd_ >= 0) close(fd_);  // releases the lock; the file stays for the next claim
}

}  // namespace longhaul::netem
