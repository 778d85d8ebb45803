#include "netem/tc/claim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace longhaul::netem {
namespace {

// `err`: the errno of the failed call, read right after it.
absl::Status Failed(const std::string& what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
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

// The lock directory is writable by every user (/run/lock, /tmp) and we may be root: open no link
// (a planted symlink or hard link would have root truncate its target) and no file of another user.
absl::StatusOr<int> OpenLockFile(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) return absl::FailedPreconditionError(absl::StrCat("lock file ", path, " is a symbolic link"));
    return Failed("open the lock file", path, err);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Failed("stat the lock file", path, err);
  }
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "lock file ", path, " is not a plain file of this user (uid ", geteuid(), ") with one link; remove it"));
  }
  return fd;
}

std::string HeldBy(const std::string& name, int64_t pid) {
  const std::string who = pid > 0 ? absl::StrCat("process ", pid) : "another process";
  return absl::StrCat("network \"", name, "\" is in use by ", who,
                      " (a sweep or test running on a network it built, or longhaul-netem up|down; lock file ",
                      NetworkClaim::LockPath(name), ")");
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
  absl::StatusOr<int> fd = OpenLockFile(path, O_RDWR | O_CREAT);
  if (!fd.ok()) return fd.status();
  NetworkClaim claim(*fd);  // closes it on every return below but the last
  // On the monotonic clock: a step of the wall clock neither ends the wait nor stretches it.
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(patience);
  bool told = false;
  for (;;) {
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) break;
    if (const int err = errno; err != EWOULDBLOCK) return Failed("lock", path, err);
    const int64_t pid = WrittenPid(*fd);
    if (std::chrono::steady_clock::now() >= give_up) return absl::FailedPreconditionError(HeldBy(name, pid));
    if (!told && waiting) waiting(pid);
    told = true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const std::string mine = absl::StrCat(getpid(), "\n");
  if (ftruncate(*fd, 0) != 0) return Failed("truncate", path, errno);
  const ssize_t n = pwrite(*fd, mine.data(), mine.size(), 0);
  if (n < 0) return Failed("write the pid into", path, errno);
  if (static_cast<size_t>(n) != mine.size()) {
    return absl::InternalError(
        absl::StrCat("short write of the pid into ", path, ": ", n, " of ", mine.size(), " bytes"));
  }
  return claim;
}

absl::StatusOr<std::optional<int64_t>> NetworkClaim::Holder(const std::string& name) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  const std::string path = LockPath(name);
  if (access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::optional<int64_t>();
  absl::StatusOr<int> fd = OpenLockFile(path, O_RDONLY);
  if (!fd.ok()) return fd.status();
  std::optional<int64_t> holder;
  if (flock(*fd, LOCK_SH | LOCK_NB) != 0) {
    if (const int err = errno; err != EWOULDBLOCK) {
      close(*fd);
      return Failed("lock", path, err);
    }
    holder = WrittenPid(*fd);
  }
  close(*fd);  // and with it the shared lock, if it got one
  return holder;
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
