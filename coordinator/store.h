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
// (links was added later; CREATE TABLE IF NOT EXISTS gives older files the table, no version bump.)
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

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_STORE_H_
