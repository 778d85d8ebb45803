#include "worker/checkpoint_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/crc32c.h"
#include "common/list_dir.h"
#include "proto/channel_config.h"
#include "proto/grpc_status.h"
#include "security/tls.h"

namespace longhaul::worker {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;
// Left free on the receiving disk beyond the replica itself (logs, the worker's own checkpoints).
constexpr int64_t kDiskReserve = int64_t{256} << 20;

std::string Errno() { return std::strerror(errno); }

std::string Gib(int64_t b) { return absl::StrCat(static_cast<double>(b) / (int64_t{1} << 30), " GiB"); }

// The copies of a job's checkpoints this worker holds.
std::string ReplicaDir(const std::string& data_dir, uint64_t job_id) {
  return absl::StrCat(data_dir, "/replicas/job-", job_id);
}

// The copies of replica `replica`'s checkpoints of a job.
std::string ReplicaSubdir(const std::string& data_dir, uint64_t job_id, int replica) {
  return absl::StrCat(ReplicaDir(data_dir, job_id), "/replica-", replica);
}

// The step of a file named stage-<stage>.step-<N>.safetensors, or -1.
int64_t StepOf(const std::string& name, int stage) {
  const std::string prefix = absl::StrCat("stage-", stage, ".step-");
  constexpr absl::string_view kSuffix = ".safetensors";
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, kSuffix)) return -1;
  int64_t step = -1;
  const std::string mid = name.substr(prefix.size(), name.size() - prefix.size() - kSuffix.size());
  return absl::SimpleAtoi(mid, &step) ? step : -1;
}

// Writes a file received in chunks: to a temporary name, checked, fsynced and renamed into place.
class FileSink {
 public:
  FileSink(std::string dest, std::string tmp) : dest_(std::move(dest)), tmp_(std::move(tmp)) {}
  ~FileSink() {
    if (fd_ >= 0) ::close(fd_);
    if (!done_) std::remove(tmp_.c_str());
  }
  absl::Status Open(int64_t total, int64_t max_bytes, const std::string& from) {
    if (total > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("checkpoint ", dest_, " from ", from, " is ", Gib(total),
                                                       ", more than the limit of ", Gib(max_bytes)));
    }
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(dest_).parent_path(), ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create the directory of ", dest_, ": ", ec.message()));
    struct statvfs vfs {};
    if (::statvfs(std::filesystem::path(dest_).parent_path().c_str(), &vfs) == 0) {
      const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
      if (free_bytes < total + kDiskReserve) {
        return absl::ResourceExhaustedError(absl::StrCat("not enough disk space for checkpoint ", dest_, " from ", from,
                                                         ": it needs ", Gib(total), " (+", Gib(kDiskReserve),
                                                         " reserve), ", Gib(free_bytes), " free"));
      }
    }
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return absl::InternalError(absl::StrCat("create ", tmp_, ": ", Errno()));
    total_ = total;
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t offset, const std::string& data) {
    if (static_cast<int64_t>(offset) != written_ || written_ + static_cast<int64_t>(data.size()) > total_) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dest_, ": chunk at offset ", offset, " (", data.size(),
                                              " bytes) does not follow byte ", written_, " of ", total_));
    }
    const char* p = data.data();
    size_t n = data.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) return absl::InternalError(absl::StrCat("write ", tmp_, ": ", Errno()));
      p += w;
      n -= static_cast<size_t>(w);
    }
    crc_ = codec::Crc32cExtend(crc_, data.data(), data.size());
    written_ += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status Commit(uint32_t want_crc) {
    if (written_ != total_) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dest_, ": the transfer ended after ", written_, " of ",
                                              total_, " bytes"));
    }
    if (crc_ != want_crc) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dest_, ": CRC32C mismatch (got ", crc_, ", sender says ",
                                              want_crc, ")"));
    }
    if (::fsync(fd_) != 0) return absl::InternalError(absl::StrCat("fsync ", tmp_, ": ", Errno()));
    ::close(fd_);
    fd_ = -1;
    if (std::rename(tmp_.c_str(), dest_.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", tmp_, " -> ", dest_, ": ", Errno()));
    }
    done_ = true;
    return absl::OkStatus();
  }
  int64_t written() const { return written_; }

 private:
  const std::string dest_, tmp_;
  int fd_ = -1;
  int64_t total_ = 0, written_ = 0;
  uint32_t crc_ = 0;
  bool done_ = false;
};

// Reads `path` in chunks, calling `send` for each (the last with the file's CRC32C).
absl::Status SendFile(const std::string& path, v1::CheckpointChunk header,
                      const std::function<bool(const v1::CheckpointChunk&)>& send) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path, ": ", Errno()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("stat ", path, ": ", Errno()));
  }
  const int64_t total = st.st_size;
  header.set_total_bytes(static_cast<uint64_t>(total));
  uint32_t crc = 0;
  int64_t off = 0;
  std::string buf;
  absl::Status s;
  do {
    const int64_t n = std::min(kChunk, total - off);
    buf.resize(static_cast<size_t>(n));
    int64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, buf.data() + got, static_cast<size_t>(n - got), off + got);
      if (r <= 0) {
        s = absl::DataLossError(absl::StrCat("read ", path, " at ", off + got, ": ", r < 0 ? Errno() : "file shrank"));
        break;
      }
      got += r;
    }
    if (!s.ok()) break;
    crc = codec::Crc32cExtend(crc, buf.data(), buf.size());
    v1::CheckpointChunk c = header;
    c.set_offset(static_cast<uint64_t>(off));
    if (off + n == total) c.set_crc32c(crc);
    *c.mutable_data() = std::move(buf);
    buf = std::string();
    if (!send(c)) {
      s = absl::AbortedError("the receiver ended the transfer");  // its status says why
      break;
    }
    off += n;
  } while (off < total);
  ::close(fd);
  return s;
}

}  // namespace

std::string StepCheckpointPath(const std::string& dir, int stage, int64_t step) {
  return absl::StrCat(dir, "/stage-", stage, ".step-", step, ".safetensors");
}

std::string ReplicaPath(const std::string& data_dir, uint64_t job_id, int stage, int replica, int64_t step) {
  return StepCheckpointPath(ReplicaSubdir(data_dir, job_id, replica), stage, step);
}

int PruneStepFiles(const std::string& dir, int stage, int64_t floor) {
  absl::StatusOr<std::vector<common::DirEntry>> es = common::ListDirectory(dir);
  if (!es.ok()) return 0;
  std::map<int64_t, std::string, std::greater<int64_t>> steps;  // newest first
  for (const common::DirEntry& e : *es) {
    const int64_t step = e.kind == common::DirEntry::kFile ? StepOf(e.name, stage) : -1;
    if (step >= 0) steps[step] = e.path;
  }
  int n = 0, kept = 0;
  for (const auto& [step, path] : steps) {
    if (kept == 0 || (step >= floor && kept < kKeepCheckpoints)) {
      ++kept;
      continue;
    }
    n += std::remove(path.c_str()) == 0;
  }
  return n;
}

absl::Status KeepStepFile(const std::string& path, const std::string& dir, int stage, int64_t step) {
  const std::string dest = StepCheckpointPath(dir, stage, step);
  std::remove(dest.c_str());  // a re-run after a restore writes the step again
  if (::link(path.c_str(), dest.c_str()) == 0) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::copy_file(path, dest, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot keep ", path, " as ", dest, ": ", ec.message()));
  return absl::OkStatus();
}

CheckpointStoreService::CheckpointStoreService(CheckpointStoreOptions o, Locate locate)
    : opt_(std::move(o)), locate_(std::move(locate)) {}

grpc::Status CheckpointStoreService::Put(grpc::ServerContext* ctx, grpc::ServerReader<v1::CheckpointChunk>* reader,
                                         v1::PutCheckpointResponse* resp) {
  v1::CheckpointChunk c;
  if (!reader->Read(&c)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty checkpoint transfer");
  const std::string from = ctx->peer();
  if (c.stage() < 0 || c.replica() < 0 || c.step() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "checkpoint transfer names a negative stage, replica or step");
  }
  const uint64_t job = c.job_id();
  const int stage = c.stage(), replica = c.replica();
  const int64_t step = c.step();
  const int64_t total = static_cast<int64_t>(c.total_bytes());
  const std::string dest = ReplicaPath(opt_.data_dir, job, stage, replica, step);
  uint64_t tmp_id;
  {
    absl::MutexLock l(&mu_);
    tmp_id = next_tmp_++;
  }
  FileSink sink(dest, absl::StrCat(dest, ".tmp", tmp_id));
  if (absl::Status s = sink.Open(total, opt_.max_bytes, from); !s.ok()) return ToGrpc(s);
  uint32_t crc = 0;
  bool more = true;
  while (more) {
    if (c.job_id() != job || c.stage() != stage || c.replica() != replica || c.step() != step ||
        static_cast<int64_t>(c.total_bytes()) != total) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a checkpoint transfer changed files midway");
    }
    if (absl::Status s = sink.Write(c.offset(), c.data()); !s.ok()) return ToGrpc(s);
    crc = c.crc32c();
    more = sink.written() < total && reader->Read(&c);
  }
  if (absl::Status s = sink.Commit(crc); !s.ok()) return ToGrpc(s);
  resp->set_bytes(total);
  PruneStepFiles(ReplicaSubdir(opt_.data_dir, job, replica), stage, -1);  // the kKeepCheckpoints cap
  return grpc::Status::OK;
}

grpc::Status CheckpointStoreService::Get(grpc::ServerContext*, const v1::GetCheckpointRequest* req,
                                         grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  std::string path = ReplicaPath(opt_.data_dir, req->job_id(), req->stage(), req->replica(), req->step());
  if (::access(path.c_str(), R_OK) != 0) {
    path = locate_ ? locate_(req->job_id(), req->stage(), req->replica(), req->step()) : "";
  }
  if (path.empty() || ::access(path.c_str(), R_OK) != 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint of job ", req->job_id(), " stage ", req->stage(), " replica ",
                                     req->replica(), " step ", req->step(), " here"));
  }
  v1::CheckpointChunk header;
  header.set_job_id(req->job_id());
  header.set_stage(req->stage());
  header.set_replica(req->replica());
  header.set_step(req->step());
  absl::Status s = SendFile(path, header, [&](const v1::CheckpointChunk& c) { return writer->Write(c); });
  return ToGrpc(s);
}

void CheckpointStoreService::Prune(uint64_t job_id, int64_t floor) {
  absl::StatusOr<std::vector<common::DirEntry>> replicas = common::ListDirectory(ReplicaDir(opt_.data_dir, job_id));
  if (!replicas.ok()) return;
  for (const common::DirEntry& r : *replicas) {
    if (r.kind != common::DirEntry::kDirectory || !absl::StartsWith(r.name, "replica-")) continue;
    absl::StatusOr<std::vector<common::DirEntry>> es = common::ListDirectory(r.path);
    if (!es.ok()) continue;
    std::vector<int> stages;
    for (const common::DirEntry& e : *es) {
      int stage = 0;
      const size_t dot = e.name.find('.');
      if (absl::StartsWith(e.name, "stage-") && dot != std::string::npos &&
          absl::SimpleAtoi(e.name.substr(6, dot - 6), &stage) &&
          std::find(stages.begin(), stages.end(), stage) == stages.end()) {
        stages.push_back(stage);
      }
    }
    for (int s : stages) PruneStepFiles(r.path, s, floor);
  }
}

absl::StatusOr<int64_t> PushCheckpoint(const std::string& target, const std::string& peer_worker,
                                       const std::string& path, uint64_t job_id, int stage, int replica,
                                       int64_t step, grpc::ClientContext* ctx) {
  auto channel = security::DataPlaneChannel(target, LonghaulChannelArgs(), peer_worker);
  auto stub = v1::CheckpointStore::NewStub(channel);
  v1::PutCheckpointResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::CheckpointChunk>> w = stub->Put(ctx, &resp);
  v1::CheckpointChunk header;
  header.set_job_id(job_id);
  header.set_stage(stage);
  header.set_replica(replica);
  header.set_step(step);
  absl::Status sent = SendFile(path, header, [&](const v1::CheckpointChunk& c) { return w->Write(c); });
  const bool local_error = !sent.ok() && sent.code() != absl::StatusCode::kAborted;
  if (sent.ok()) {
    w->WritesDone();
  } else if (local_error) {
    ctx->TryCancel();  // the receiver would wait for the rest (and drops the partial file)
  }
  grpc::Status s = w->Finish();
  if (local_error) return sent;
  // The receiver's reason (a limit, the disk) explains a broken write best.
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("copying ", path, " to ", target, ": ", s.error_message()));
  }
  if (!sent.ok()) return sent;
  return resp.bytes();
}

absl::StatusOr<int64_t> FetchCheckpoint(const std::string& target, const std::string& peer_worker, uint64_t job_id,
                                        int stage, int replica, int64_t step, const std::string& dest,
                                        int64_t max_bytes, absl::Duration timeout) {
  auto channel = security::DataPlaneChannel(target, LonghaulChannelArgs(), peer_worker);
  auto stub = v1::CheckpointStore::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetCheckpointRequest req;
  req.set_job_id(job_id);
  req.set_stage(stage);
  req.set_replica(replica);
  req.set_step(step);
  std::unique_ptr<grpc::ClientReader<v1::CheckpointChunk>> r = stub->Get(&ctx, req);
  // A temporary name of its own: two fetches of the same destination must not write one file.
  static std::atomic<uint64_t> fetches{0};
  FileSink sink(dest, absl::StrCat(dest, ".fetch-tmp.", getpid(), ".", fetches.fetch_add(1)));
  v1::CheckpointChunk c;
  absl::Status st;
  bool opened = false;
  uint32_t crc = 0;
  int64_t total = 0;
  while (st.ok() && r->Read(&c)) {
    if (c.job_id() != job_id || c.stage() != stage || c.replica() != replica || c.step() != step) {
      st = absl::DataLossError(absl::StrCat("from ", target, ": a chunk of job ", c.job_id(), " stage ", c.stage(),
                                            " replica ", c.replica(), " step ", c.step(), ", asked for job ", job_id,
                                            " stage ", stage, " replica ", replica, " step ", step));
      break;
    }
    if (!opened) {
      total = static_cast<int64_t>(c.total_bytes());
      st = sink.Open(total, max_bytes, target);
      opened = true;
      if (!st.ok()) break;
    }
    st = sink.Write(c.offset(), c.data());
    crc = c.crc32c();
  }
  if (!st.ok()) {
    ctx.TryCancel();
    (void)r->Finish();
    return st;
  }
  grpc::Status s = r->Finish();
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("from ", target, ": ", s.error_message()));
  }
  if (!opened) return absl::DataLossError(absl::StrCat("from ", target, ": an empty transfer"));
  if (absl::Status cs = sink.Commit(crc); !cs.ok()) return cs;
  return total;
}

CheckpointReplicator::CheckpointReplicator(Target target, uint64_t job_id, int stage, int replica, int attempt,
                                           Report report)
    : target_(std::move(target)),
      job_id_(job_id),
      stage_(stage),
      replica_(replica),
      attempt_(attempt),
      report_(std::move(report)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointReplicator::~CheckpointReplicator() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    pending_.clear();
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  thread_.join();
}

void CheckpointReplicator::Enqueue(int64_t step, std::string path) {
  std::pair<int64_t, std::string> dropped{-1, ""};
  {
    absl::MutexLock l(&mu_);
    if (stop_) return;
    if (pending_.size() >= kMaxPending) {
      dropped = std::move(pending_.front());
      pending_.pop_front();
    }
    pending_.emplace_back(step, std::move(path));
  }
  if (dropped.first >= 0 && report_) {
    v1::CheckpointReplicated r;
    r.set_job_id(job_id_);
    r.set_stage(stage_);
    r.set_replica(replica_);
    r.set_step(dropped.first);
    r.set_attempt(attempt_);
    r.set_replica_worker_id(target_.worker_id);
    r.set_error(absl::StrCat("not copied: checkpoints come faster than they can be copied to ", target_.name));
    report_(r);
  }
}

void CheckpointReplicator::Loop() {
  for (;;) {
    std::pair<int64_t, std::string> item;
    grpc::ClientContext ctx;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !pending_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      item = std::move(pending_.front());
      pending_.pop_front();
      in_flight_ = &ctx;
    }
    const absl::Time t0 = absl::Now();
    absl::StatusOr<int64_t> n = PushCheckpoint(target_.address, target_.name, item.second, job_id_, stage_, replica_, item.first, &ctx);
    v1::CheckpointReplicated r;
    r.set_job_id(job_id_);
    r.set_stage(stage_);
    r.set_replica(replica_);
    r.set_step(item.first);
    r.set_attempt(attempt_);
    r.set_replica_worker_id(target_.worker_id);
    r.set_seconds(absl::ToDoubleSeconds(absl::Now() - t0));
    if (n.ok()) {
      r.set_bytes(*n);
    } else {
      r.set_error(absl::StrCat("copy to ", target_.name, " failed: ", n.status().message()));
    }
    bool stopped;
    {
      absl::MutexLock l(&mu_);
      in_flight_ = nullptr;
      stopped = stop_;
    }
    if (!stopped && report_) report_(r);
  }
}

}  // namespace longhaul::worker
