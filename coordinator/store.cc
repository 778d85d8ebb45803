#include "coordinator/store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

namespace longhaul::coordinator {
namespace {

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  absl::Status ok() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  sqlite3_stmt* get() { return s_; }
  absl::Status Done() {
    const int rc = sqlite3_step(s_);
    if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open state file ", path, ": ", msg));
  }
  std::unique_ptr<Store> s(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=NORMAL",
           "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
           "INSERT OR IGNORE INTO meta VALUES('schema_version', '1')",
           "CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY, name TEXT, state INTEGER, status BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS losses(job_id INTEGER, step INTEGER, loss REAL, PRIMARY KEY(job_id, step))",
           "CREATE TABLE IF NOT EXISTS workers(id INTEGER PRIMARY KEY, name TEXT UNIQUE, status BLOB NOT NULL)",
       }) {
    if (absl::Status st = s->Exec(sql); !st.ok()) {
      return absl::UnavailableError(absl::StrCat("state file ", path, ": ", st.message()));
    }
  }
  Stmt v(db, "SELECT value FROM meta WHERE key='schema_version'");
  if (!v.ok().ok() || sqlite3_step(v.get()) != SQLITE_ROW ||
      std::string(reinterpret_cast<const char*>(sqlite3_column_text(v.get(), 0))) != "1") {
    return absl::FailedPreconditionError(absl::StrCat("state file ", path, " has an unknown schema version"));
  }
  return s;
}

Store::~Store() { sqlite3_close(db_); }

absl::Status Store::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", err ? err : "error", " in: ", sql));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::Status Store::PutJob(const v1::JobStatus& job) {
  v1::JobStatus copy = job;
  copy.clear_losses();  // in the losses table
  const std::string blob = copy.SerializeAsString();
  Stmt s(db_, "INSERT OR REPLACE INTO jobs(id, name, state, status) VALUES(?, ?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(job.job_id()));
  sqlite3_bind_text(s.get(), 2, job.name().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s.get(), 3, job.state());
  sqlite3_bind_blob(s.get(), 4, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  return s.Done();
}

absl::StatusOr<std::vector<v1::JobStatus>> Store::LoadJobs() {
  Stmt s(db_, "SELECT id, status FROM jobs ORDER BY id");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  std::vector<v1::JobStatus> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    v1::JobStatus j;
    const void* p = sqlite3_column_blob(s.get(), 1);
    const int n = sqlite3_column_bytes(s.get(), 1);
    if (!j.ParseFromArray(p, n)) {
      return absl::DataLossError(absl::StrCat("state file: job ", sqlite3_column_int64(s.get(), 0), " is corrupt"));
    }
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return out;
}

absl::Status Store::AppendLoss(uint64_t job_id, int64_t step, double loss) {
  Stmt s(db_, "INSERT OR REPLACE INTO losses(job_id, step, loss) VALUES(?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(job_id));
  sqlite3_bind_int64(s.get(), 2, step);
  sqlite3_bind_double(s.get(), 3, loss);
  return s.Done();
}

absl::StatusOr<std::vector<double>> Store::Losses(uint64_t job_id) {
  Stmt s(db_, "SELECT loss FROM losses WHERE job_id = ? ORDER BY step");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(job_id));
  std::vector<double> out;
  while (sqlite3_step(s.get()) == SQLITE_ROW) out.push_back(sqlite3_column_double(s.get(), 0));
  return out;
}

absl::Status Store::PutWorker(const v1::WorkerStatus& w) {
  const std::string blob = w.SerializeAsString();
  Stmt s(db_, "INSERT OR REPLACE INTO workers(id, name, status) VALUES(?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(w.worker_id()));
  sqlite3_bind_text(s.get(), 2, w.info().name().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(s.get(), 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  return s.Done();
}

absl::StatusOr<std::vector<v1::WorkerStatus>> Store::LoadWorkers() {
  Stmt s(db_, "SELECT id, status FROM workers ORDER BY id");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  std::vector<v1::WorkerStatus> out;
  while (sqlite3_step(s.get()) == SQLITE_ROW) {
    v1::WorkerStatus w;
    if (!w.ParseFromArray(sqlite3_column_blob(s.get(), 1), sqlite3_column_bytes(s.get(), 1))) {
      return absl::DataLossError(absl::StrCat("state file: worker ", sqlite3_column_int64(s.get(), 0), " is corrupt"));
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace longhaul::coordinator
