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

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Exec(const std::string& sql);
  sqlite3* db_;
};

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_STORE_H_
