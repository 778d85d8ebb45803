#include "coordinator/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

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

// Takes the exclusive lock of `path`'s sidecar lock file and writes this process's pid into it;
// returns its descriptor, to be kept open while the state file is in use.
absl::StatusOr<int> LockStateFile(const std::string& path) {
  const std::string lock = path + ".lock";
  const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open state file ", path, ": cannot create its lock file ", lock, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("cannot lock state file ", path, " (", lock, "): ", std::strerror(err)));
    }
    const std::string pid(absl::StripAsciiWhitespace(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0)));
    return absl::FailedPreconditionError(absl::StrCat("state file ", path, " is in use by another coordinator (",
                                                      pid.empty() ? "" : absl::StrCat("pid ", pid, ", "),
                                                      "which holds ", lock, "); only one may use a state file"));
  }
  const std::string mine = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    // The lock holds without the pid; only the message of a refused second coordinator is poorer.
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  absl::StatusOr<int> lock_fd = LockStateFile(path);
  if (!lock_fd.ok()) return lock_fd.status();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    close(*lock_fd);
    return absl::UnavailableError(absl::StrCat("cannot open state file ", path, ": ", msg));
  }
  std::unique_ptr<Store> s(new Store(db, *lock_fd));
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=NORMAL",
           "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
           "INSERT OR IGNORE INTO meta VALUES('schema_version', '1')",
           "CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY, name TEXT, state INTEGER, status BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS losses(job_id INTEGER, step INTEGER, loss REAL, PRIMARY KEY(job_id, step))",
           "CREATE TABLE IF NOT EXISTS workers(id INTEGER PRIMARY KEY, name TEXT UNIQUE, status BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS links(src INTEGER, dst INTEGER, m BLOB NOT NULL, PRIMARY KEY(src, dst))",
           "CREATE TABLE IF NOT EXISTS tokens(hash TEXT PRIMARY KEY, role TEXT NOT NULL, expires_unix REAL NOT NULL, "
           "uses_left INTEGER NOT NULL, created_unix REAL NOT NULL)",
           "CREATE TABLE IF NOT EXISTS identities(name TEXT PRIMARY KEY, role TEXT NOT NULL, issued_unix REAL NOT NULL)",
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

Store::~Store() {
  if (depth_ > 0) (void)Exec("COMMIT");
  sqlite3_close(db_);
  close(lock_fd_);  // releases the lock
}

absl::Status Store::Begin() {
  if (depth_++ > 0) return absl::OkStatus();
  absl::Status s = Exec("BEGIN");
  if (!s.ok()) depth_ = 0;
  return s;
}

absl::Status Store::Commit() {
  if (depth_ == 0) return absl::FailedPreconditionError("Store::Commit without Begin");
  if (--depth_ > 0) return absl::OkStatus();
  absl::Status s = Exec("COMMIT");
  // A failed COMMIT leaves the transaction open (SQLITE_BUSY) or already rolled back; either way
  // roll back so the next Begin starts clean.
  if (!s.ok() && !sqlite3_get_autocommit(db_)) (void)Exec("ROLLBACK");
  return s;
}

absl::StatusOr<std::string> Store::JournalMode() {
  Stmt s(db_, "PRAGMA journal_mode");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  if (sqlite3_step(s.get()) != SQLITE_ROW) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return std::string(reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0)));
}

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

absl::Status Store::PutLink(const v1::LinkMeasurement& m) {
  v1::LinkMeasurement copy = m;
  copy.clear_age_seconds();
  const std::string blob = copy.SerializeAsString();
  Stmt s(db_, "INSERT OR REPLACE INTO links(src, dst, m) VALUES(?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_int64(s.get(), 1, static_cast<sqlite3_int64>(m.from_worker_id()));
  sqlite3_bind_int64(s.get(), 2, static_cast<sqlite3_int64>(m.to_worker_id()));
  sqlite3_bind_blob(s.get(), 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  return s.Done();
}

absl::StatusOr<std::vector<v1::LinkMeasurement>> Store::LoadLinks() {
  Stmt s(db_, "SELECT src, dst, m FROM links ORDER BY src, dst");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  std::vector<v1::LinkMeasurement> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    v1::LinkMeasurement m;
    if (!m.ParseFromArray(sqlite3_column_blob(s.get(), 2), sqlite3_column_bytes(s.get(), 2))) {
      return absl::DataLossError(absl::StrCat("state file: link ", sqlite3_column_int64(s.get(), 0), " -> ",
                                              sqlite3_column_int64(s.get(), 1), " is corrupt"));
    }
    out.push_back(std::move(m));
  }
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return out;
}

absl::Status Store::PutToken(const std::string& hash, const std::string& role, double expires_unix, int uses,
                             double now_unix) {
  // Expired tokens are of no use to anyone; they go when a new one is made.
  Stmt del(db_, "DELETE FROM tokens WHERE expires_unix < ?");
  if (absl::Status st = del.ok(); !st.ok()) return st;
  sqlite3_bind_double(del.get(), 1, now_unix - 7 * 24 * 3600.0);  // kept a week, to say "expired" rather than "unknown"
  if (absl::Status st = del.Done(); !st.ok()) return st;
  Stmt s(db_, "INSERT INTO tokens(hash, role, expires_unix, uses_left, created_unix) VALUES(?, ?, ?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_text(s.get(), 1, hash.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s.get(), 2, role.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(s.get(), 3, expires_unix);
  sqlite3_bind_int64(s.get(), 4, uses);
  sqlite3_bind_double(s.get(), 5, now_unix);
  return s.Done();
}

absl::StatusOr<std::string> Store::UseToken(const std::string& hash, double now_unix) {
  Stmt s(db_, "SELECT role, expires_unix, uses_left FROM tokens WHERE hash = ?");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_text(s.get(), 1, hash.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(s.get()) != SQLITE_ROW) {
    return absl::PermissionDeniedError("unknown join token (mistyped, or made by another coordinator)");
  }
  const std::string role = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0));
  const double expires = sqlite3_column_double(s.get(), 1);
  const int64_t uses = sqlite3_column_int64(s.get(), 2);
  if (expires <= now_unix) {
    return absl::PermissionDeniedError(
        absl::StrCat("join token expired ", static_cast<int64_t>(now_unix - expires), " s ago (longhaulctl token create)"));
  }
  if (uses <= 0) return absl::PermissionDeniedError("join token used up (every join it allowed was made)");
  Stmt u(db_, "UPDATE tokens SET uses_left = uses_left - 1 WHERE hash = ?");
  if (absl::Status st = u.ok(); !st.ok()) return st;
  sqlite3_bind_text(u.get(), 1, hash.c_str(), -1, SQLITE_TRANSIENT);
  if (absl::Status st = u.Done(); !st.ok()) return st;
  return role;
}

StoreTransaction::StoreTransaction(Store& s) : s_(s) {
  absl::Status st = s_.Begin();
  begun_ = st.ok();
  if (!begun_) common::Log("coordinator", absl::StrCat("cannot begin a state file transaction: ", st.message()));
}

StoreTransaction::~StoreTransaction() {
  if (!begun_) return;
  if (absl::Status st = s_.Commit(); !st.ok()) {
    common::Log("coordinator", absl::StrCat("cannot commit to the state file: ", st.message()));
  }
}

absl::StatusOr<std::optional<Store::Issued>> Store::FindIssued(const std::string& name) {
  Stmt s(db_, "SELECT role, issued_unix FROM identities WHERE name = ?");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_text(s.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(s.get());
  if (rc == SQLITE_DONE) return std::optional<Issued>();
  if (rc != SQLITE_ROW) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  const unsigned char* role = sqlite3_column_text(s.get(), 0);
  return std::optional<Issued>(Issued{role ? reinterpret_cast<const char*>(role) : "", sqlite3_column_double(s.get(), 1)});
}

absl::Status Store::PutIssued(const std::string& name, const std::string& role, double now_unix) {
  Stmt s(db_, "INSERT OR REPLACE INTO identities(name, role, issued_unix) VALUES(?, ?, ?)");
  if (absl::Status st = s.ok(); !st.ok()) return st;
  sqlite3_bind_text(s.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s.get(), 2, role.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(s.get(), 3, now_unix);
  return s.Done();
}

}  // namespace longhaul::coordinator
