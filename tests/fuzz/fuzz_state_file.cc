// Fuzz target: the coordinator's state-file loader — Store (coordinator/store.h: the rows and the
// protobuf blobs in them) and CoordinatorService::Create, which turns them back into jobs, workers
// and the link matrix and re-runs scheduling, recovery deadlines and re-attachment on them. A
// state file is the coordinator's own, but one copied from elsewhere, corrupted on disk or
// edited by hand must give a coordinator that starts (or refuses to, with a message), never one
// that crashes.
//
// The SQLite file format itself is SQLite's to defend: the input describes rows, written with a
// connection of the fuzzer's own into a valid file, each blob either raw fuzz bytes or a valid
// message (a running job on workers 1..4, a worker, a link) followed by fuzz bytes — protobuf
// merges appended fields into the message, so these are valid records with hostile fields
// (stages, layers, placements, attempts, ids). Then the coordinator is created on the file, a
// worker registers naming a fuzzed running stage (re-attachment), time passes (deadlines, the
// watchdog, scheduling) and every read handler runs.
//
// Run with -close_fd_mask=2: the coordinator logs each load on stderr (crash reports still show).
#include <fuzzer/FuzzedDataProvider.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_spec.h"
#include "coordinator/store.h"

using namespace longhaul;
using coordinator::CoordinatorService;
using coordinator::Store;

namespace {

std::string g_path;       // the state file
sqlite3* g_raw = nullptr;  // the fuzzer's own connection, which writes the rows

void Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(g_raw, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::fprintf(stderr, "fuzz_state_file: %s: %s\n", sql, err ? err : "?");
    std::abort();
  }
}

void RemoveFiles() {
  if (g_raw) sqlite3_close(g_raw);
  for (const char* suffix : {"", ".lock", "-wal", "-shm"}) unlink((g_path + suffix).c_str());
  rmdir(g_path.substr(0, g_path.rfind('/')).c_str());
}

std::string BaseJob(uint64_t id) {
  v1::JobStatus j;
  j.set_job_id(id);
  j.set_name("j");
  j.set_state(v1::JOB_STATE_RUNNING);
  *j.mutable_spec() = coordinator::DefaultJobSpec();
  j.set_steps(j.spec().steps());
  for (int s = 0; s < 4; ++s) {
    v1::StagePlacement* p = j.add_stages();
    p->set_stage(s);
    p->set_worker_id(s + 1);
    p->set_layer_begin(s);
    p->set_layer_end(s + 1);
  }
  return j.SerializeAsString();
}

std::string BaseWorker(uint64_t id) {
  v1::WorkerStatus w;
  w.set_worker_id(id);
  w.mutable_info()->set_name("w" + std::to_string(id));
  w.mutable_info()->set_address("127.0.0.1:1");
  w.set_state(v1::WORKER_STATE_BUSY);
  w.set_job_id(1);
  return w.SerializeAsString();
}

std::string BaseLink(uint64_t from, uint64_t to) {
  v1::LinkMeasurement m;
  m.set_from_worker_id(from);
  m.set_to_worker_id(to);
  m.set_rtt_ms(10);
  m.set_mbit_per_s(100);
  return m.SerializeAsString();
}

void Insert(const char* sql, int64_t a, int64_t b, const std::string& blob, double loss = 0) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(g_raw, sql, -1, &st, nullptr) != SQLITE_OK) std::abort();
  sqlite3_bind_int64(st, 1, a);
  sqlite3_bind_int64(st, 2, b);
  if (blob.empty() && loss != 0) {
    sqlite3_bind_double(st, 3, loss);
  } else {
    sqlite3_bind_blob(st, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  }
  sqlite3_step(st);  // a duplicate key is simply not inserted
  sqlite3_finalize(st);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp")) +
                    "/longhaul-fuzz-state-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) std::abort();
  g_path = dir + "/state.db";
  {
    absl::StatusOr<std::unique_ptr<Store>> s = Store::Open(g_path);  // creates the schema
    if (!s.ok()) std::abort();
  }
  if (sqlite3_open(g_path.c_str(), &g_raw) != SQLITE_OK) std::abort();
  sqlite3_busy_timeout(g_raw, 5000);
  std::atexit(RemoveFiles);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Exec("BEGIN");
  Exec("DELETE FROM jobs; DELETE FROM workers; DELETE FROM links; DELETE FROM losses");
  const int records = in.ConsumeIntegralInRange(0, 12);
  for (int i = 0; i < records && in.remaining_bytes() > 0; ++i) {
    const int table = in.ConsumeIntegralInRange(0, 3);
    // Mostly small ids (so rows refer to each other), sometimes any.
    const int64_t id = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(0, 6);
    const int64_t id2 = in.ConsumeIntegralInRange<int64_t>(0, 6);
    const bool on_base = in.ConsumeBool();
    const std::string tail = in.ConsumeRandomLengthString(2048);
    const auto u = static_cast<uint64_t>(id);
    switch (table) {
      case 0:
        Insert("INSERT INTO jobs(id, name, state, status) VALUES(?, 'j', ?, ?)", id, 0,
               on_base ? BaseJob(u) + tail : tail);
        break;
      case 1:
        Insert("INSERT INTO workers(id, name, status) VALUES(?, ?, ?)", id, id2,
               on_base ? BaseWorker(u) + tail : tail);
        break;
      case 2:
        Insert("INSERT INTO links(src, dst, m) VALUES(?, ?, ?)", id, id2, on_base ? BaseLink(u, id2) + tail : tail);
        break;
      default:
        Insert("INSERT INTO losses(job_id, step, loss) VALUES(?, ?, ?)", id, id2, "", 1.5 + static_cast<double>(tail.size()));
        break;
    }
  }
  Exec("COMMIT");

  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(g_path);
  if (!store.ok()) std::abort();  // the file itself is valid: only its rows are hostile
  common::FakeClock clock;
  coordinator::CoordinatorOptions o;
  o.clock = &clock;
  o.placement.solve.time_limit = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<CoordinatorService>> svc = CoordinatorService::Create(*std::move(store), o);
  if (!svc.ok()) {
    if (svc.status().message().empty()) std::abort();
    return 0;
  }
  // A worker of the stored registry comes back, naming a (fuzzed) stage it runs.
  v1::RegisterRequest reg;
  reg.mutable_info()->set_name(absl::StrCat("w", in.ConsumeIntegralInRange(0, 6)));
  reg.mutable_info()->set_address("127.0.0.1:2");
  if (in.ConsumeBool()) {
    v1::RunningStage* r = reg.mutable_running();
    r->set_job_id(in.ConsumeIntegralInRange<uint64_t>(0, 6));
    r->set_stage(in.ConsumeIntegral<int32_t>());
    r->set_attempt(in.ConsumeIntegral<int32_t>());
    r->set_replica(in.ConsumeIntegral<int32_t>());
  }
  v1::RegisterResponse reg_resp;
  (void)(*svc)->Register(nullptr, &reg, &reg_resp);
  for (int i = 0; i < 3; ++i) {
    clock.Advance(absl::Minutes(20));  // past the re-attach grace, the stop timeout, recovery.wait
    (*svc)->CheckHeartbeats();
  }
  v1::ListJobsResponse jobs;
  (void)(*svc)->ListJobs(nullptr, nullptr, &jobs);
  for (const v1::JobStatus& j : jobs.jobs()) {
    v1::GetJobRequest req;
    req.set_job_id(j.job_id());
    req.set_include_losses(true);
    v1::JobStatus st;
    (void)(*svc)->GetJob(nullptr, &req, &st);
  }
  v1::ListWorkersResponse workers;
  (void)(*svc)->ListWorkers(nullptr, nullptr, &workers);
  v1::ListLinksRequest links_req;
  v1::ListLinksResponse links;
  (void)(*svc)->ListLinks(nullptr, &links_req, &links);
  return 0;
}
