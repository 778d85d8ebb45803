// The coordinator's persistent state in one SQLite file: jobs (their full JobStatus, spec and YAML
// included), per-step losses, and the worker registry. Written through on every change, so a
// restarted coordinator answers `longhaulctl status` exactly as before.
//
//   auto store = Store::Open("/var/lib/longhaul/coordinator.db");
//   (*store)->PutJob(status);  (*store)->AppendLoss(job_id, step, loss);
//
// Schema (version 1):
//   jobs(id INTEGER PRIMARY KEY, name TEXT, state INTEGER, status BLOB)     -- v1.JobStatus bytes
//   losses(job_id INTEGER, step INTEGER, loss REAL, PRIMARY KEY(job_id, step))
//   workers(id INTEGER PRIMARY KEY, name TEXT UNIQUE, status BLOB)          -- v1.WorkerStatus bytes
//   links(src INTEGER, dst INTEGER, m BLOB, PRIMARY KEY(src, dst))          -- v1.LinkMeasurement bytes
//   tokens(hash TEXT PRIMARY KEY, role TEXT, expires_unix REAL, uses_left INTEGER, created_unix REAL)
//                                                  -- join tokens by SHA-256 (docs/security.md)
//   identities(name TEXT PRIMARY KEY, role TEXT, issued_unix REAL)  -- names the CA has certified
// (links, tokens and identities were added later; CREATE TABLE IF NOT EXISTS gives older files the tables, no
// version bump.)
//
// One process per state file: Open takes an exclusive flock(2) on the sidecar `<path>.lock` (and
// writes its pid there) for the Store's lifetime, so a second coordinator on the same file fails
// at start-up, naming the holder; the kernel drops the lock when the holder dies, kill -9 included.
// The file is in WAL mode with synchronous=NORMAL: a crash of the process at any moment loses no
// committed transaction, and a power loss at most the last ones, never consistency. Changes made
// together (a job placed and its workers marked busy, ...) go in one transaction (Begin/Commit).
//
// Not thread-safe: the coordinator calls it under its state mutex.
#ifndef LONGHAUL_COORDINATOR_STORE_H_
#define LONGHAUL_COORDINATOR_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "longhaul/v1/control_plane.pb.h"

struct sqlite3;

namespace longhaul::coordinator {

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();

  absl::Status PutJob(const v1::JobStatus& job);
  absl::StatusOr<std::vector<v1::JobStatus>> LoadJobs();
  absl::Status AppendLoss(uint64_t job_id, int64_t step, double loss);
  absl::StatusOr<std::vector<double>> Losses(uint64_t job_id);

  absl::Status PutWorker(const v1::WorkerStatus& w);
  absl::StatusOr<std::vector<v1::WorkerStatus>> LoadWorkers();

  // The link matrix: the latest measurement of each directed pair of worker ids (age_seconds is
  // not stored; it is computed from measured_unix when read).
  absl::Status PutLink(const v1::LinkMeasurement& m);
  absl::StatusOr<std::vector<v1::LinkMeasurement>> LoadLinks();

  // Join tokens (docs/security.md), by the hash of the token (the token itself is never stored).
  absl::Status PutToken(const std::string& hash, const std::string& role, double expires_unix, int uses,
                        double now_unix);
  // Takes one use of the token: its role, or PERMISSION_DENIED saying why not (unknown, expired,
  // used up). Call inside Begin/Commit, so the check and the use are one transaction.
  absl::StatusOr<std::string> UseToken(const std::string& hash, double now_unix);
  // Names the cluster CA has certified: a join under a name already given a certificate is refused
  // (its holder would pass as that worker). When `name` was issued: its role and time.
  struct Issued {
    std::string role;
    double issued_unix = 0;
  };
  absl::StatusOr<std::optional<Issued>> FindIssued(const std::string& name);
  absl::Status PutIssued(const std::string& name, const std::string& role, double now_unix);  // replaces

  // Every write between Begin and the matching Commit is one transaction. Nested pairs join the
  // outermost one (only it writes BEGIN and COMMIT), so a helper may open its own.
  absl::Status Begin();
  absl::Status Commit();

  // The journal mode SQLite reports for the file ("wal").
  absl::StatusOr<std::string> JournalMode();

 private:
  Store(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}
  absl::Status Exec(const std::string& sql);
  sqlite3* db_;
  int lock_fd_;    // holds the flock on <path>.lock
  int depth_ = 0;  // open Begin()s
};

// Makes the Store writes of one handler a single transaction, so a crash leaves all of them or
// none (a job placed without its workers marked busy, ...): Begin when made, Commit when it goes
// out of scope. A failure of either is logged (a handler has nobody to tell).
class StoreTransaction {
 public:
  explicit StoreTransaction(Store& s);
  ~StoreTransaction();
  StoreTransaction(const StoreTransaction&) = delete;
  StoreTransaction& operator=(const StoreTransaction&) = delete;

 private:
  Store& s_;
  bool begun_ = false;
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_STORE_H_
