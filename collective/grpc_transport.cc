#include "collective/grpc_transport.h"

#include <algorithm>
#include <climits>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/crc32c.h"
#include "proto/channel_config.h"
#include "proto/grpc_status.h"
#include "security/tls.h"

namespace longhaul::collective {

namespace {

// gRPC prefixes every message with a 1-byte flag and a 4-byte length.
constexpr int64_t kGrpcMessagePrefixBytes = 5;

bool SameHeader(const v1::CollectiveChunk& a, const v1::CollectiveChunk& b) {
  return a.group() == b.group() && a.from_rank() == b.from_rank() && a.to_rank() == b.to_rank() &&
         a.tag() == b.tag() && a.total_bytes() == b.total_bytes() && a.chunk_count() == b.chunk_count() &&
         a.crc32c() == b.crc32c();
}

}  // namespace

uint64_t CollectiveChunkCount(uint64_t total) {
  return total == 0 ? 1 : (total + kCollectiveChunkBytes - 1) / kCollectiveChunkBytes;
}

// ------------------------------------------------------------------------------------ service

absl::Status CollectiveService::Register(const std::string& group, std::shared_ptr<Mailbox> box,
                                         std::vector<std::string> names) {
  if (!names.empty() && static_cast<int>(names.size()) != box->size()) {
    return absl::InvalidArgumentError(absl::StrCat(names.size(), " worker names for ", box->size(), " ranks"));
  }
  absl::MutexLock l(&mu_);
  const int rank = box->rank();
  auto [it, inserted] = boxes_.emplace(std::make_pair(group, rank), Registered{box, std::move(names)});
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, " of collective group '", group, "' is already registered here"));
  }
  return absl::OkStatus();
}

void CollectiveService::Unregister(const std::string& group, int rank) {
  absl::MutexLock l(&mu_);
  boxes_.erase({group, rank});
}

CollectiveService::Registered CollectiveService::Find(const std::string& group, int rank) {
  absl::MutexLock l(&mu_);
  auto it = boxes_.find({group, rank});
  return it == boxes_.end() ? Registered{} : it->second;
}

grpc::Status CollectiveService::Send(grpc::ServerContext* ctx, grpc::ServerReader<v1::CollectiveChunk>* reader,
                                     v1::CollectiveAck* ack) {
  v1::CollectiveChunk first;
  if (!reader->Read(&first)) return {grpc::StatusCode::INVALID_ARGUMENT, "a collective message without chunks"};
  if (first.group().size() > kMaxGroupNameBytes) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("group name of ", first.group().size(), " bytes (at most ", kMaxGroupNameBytes, ")")};
  }
  if (first.to_rank() > INT_MAX) return {grpc::StatusCode::INVALID_ARGUMENT, "to_rank out of range"};
  const Registered reg = Find(first.group(), static_cast<int>(first.to_rank()));
  const std::shared_ptr<Mailbox>& box = reg.box;
  if (!box) {
    return {grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no rank ", first.to_rank(), " of collective group '", first.group(), "' on this server")};
  }
  if (first.from_rank() >= static_cast<uint32_t>(box->size()) || first.from_rank() == first.to_rank()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("rank ", first.to_rank(), " of a group of ", box->size(),
                         " cannot take a message from rank ", first.from_rank())};
  }
  const int from = static_cast<int>(first.from_rank());
  // mTLS: only the worker that is rank `from` may speak as it (before anything can poison the box).
  if (!reg.names.empty()) {
    if (std::optional<security::Identity> who = security::PeerIdentity(*ctx->auth_context());
        who && who->name != reg.names[from]) {
      const std::string why = absl::StrCat("rank ", from, " of collective group '", first.group(), "' is worker ",
                                           reg.names[from], ", not ", who->name);
      refusals_.Warn(who->name, absl::StrCat("refused a message from ", ctx->peer(), ": ", why));
      return {grpc::StatusCode::PERMISSION_DENIED, why};
    }
  }
  // From here the sender is known: a malformed message also fails the receiver's next receive
  // from it (a hostile or broken peer should not leave the receiver waiting out its deadline).
  auto refuse = [&](grpc::StatusCode code, const std::string& why) {
    const std::string msg = absl::StrCat("collective message from rank ", from, " to rank ", first.to_rank(),
                                         " (tag ", first.tag(), ") refused: ", why);
    box->Poison(from, absl::Status(static_cast<absl::StatusCode>(code), msg));
    return grpc::Status(code, msg);
  };
  const bool abort = first.tag() == kAbortTag;
  const uint64_t total = first.total_bytes();
  const uint64_t limit = abort ? kMaxAbortBytes : static_cast<uint64_t>(box->max_message_bytes());
  if (total > limit) {
    return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat(total, " bytes exceed the limit of ", limit, " bytes"));
  }
  if (first.chunk_count() != CollectiveChunkCount(total)) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat(first.chunk_count(), " chunks for ", total, " bytes (expected ",
                               CollectiveChunkCount(total), " of ", kCollectiveChunkBytes, " bytes)"));
  }
  std::string msg;
  msg.reserve(static_cast<size_t>(total));  // bounded by the limit checked above
  uint32_t crc = 0;
  v1::CollectiveChunk c = std::move(first);
  // The first chunk's header fields, which every chunk must repeat (copied without the data).
  std::string data0;
  c.mutable_data()->swap(data0);
  const v1::CollectiveChunk header = c;
  c.mutable_data()->swap(data0);
  for (uint32_t i = 0;; ++i) {
    if (c.chunk_index() != i) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("chunk ", c.chunk_index(), " where chunk ", i, " was due"));
    }
    if (!SameHeader(c, header)) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("chunk ", i, "'s header differs from chunk 0's"));
    }
    const uint64_t expected = std::min<uint64_t>(kCollectiveChunkBytes, total - uint64_t{i} * kCollectiveChunkBytes);
    if (c.data().size() != expected) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("chunk ", i, " carries ", c.data().size(), " bytes, expected ", expected));
    }
    crc = codec::Crc32cExtend(crc, c.data().data(), c.data().size());
    msg.append(c.data());
    if (i + 1 == header.chunk_count()) break;
    if (!reader->Read(&c)) {
      return refuse(ctx->IsCancelled() ? grpc::StatusCode::CANCELLED : grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("the message ended after ", i + 1, " of ", header.chunk_count(), " chunks"));
    }
  }
  if (v1::CollectiveChunk extra; reader->Read(&extra)) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, "chunks after the last one");
  }
  if (crc != header.crc32c()) {
    return refuse(grpc::StatusCode::DATA_LOSS,
                  absl::StrCat("CRC32C ", crc, " of the data does not match the header's ", header.crc32c()));
  }
  if (abort) {
    box->Abort(absl::AbortedError(absl::StrCat("rank ", from, " aborted the group: ", msg)));
    return grpc::Status::OK;
  }
  absl::Status s = box->Deliver(from, header.tag(), std::move(msg), absl::FromChrono(ctx->deadline()));
  if (!s.ok()) return ToGrpc(s);
  ack->set_bytes(total);
  return grpc::Status::OK;
}

grpc::Status CollectiveService::Ping(grpc::ServerContext*, const v1::CollectivePingRequest* req,
                                     v1::CollectivePingReply*) {
  if (req->to_rank() > INT_MAX || !Find(req->group(), static_cast<int>(req->to_rank())).box) {
    return {grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no rank ", req->to_rank(), " of collective group '", req->group(), "' on this server")};
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------------- transport

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(CollectiveService* service,
                                                                     GrpcTransportOptions o) {
  const int n = static_cast<int>(o.addresses.size());
  if (o.group.empty() || o.group.size() > kMaxGroupNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a group name of 1 to ", kMaxGroupNameBytes, " bytes is needed"));
  }
  if (n < 1 || o.rank < 0 || o.rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank, " is not in a group of ", n));
  }
  if (!o.links.empty() && static_cast<int>(o.links.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(o.links.size(), " link profiles for ", n, " ranks"));
  }
  auto box = std::make_shared<Mailbox>(o.rank, n, o.max_message_bytes, o.max_buffered_bytes);
  if (absl::Status s = service->Register(o.group, box, o.names); !s.ok()) return s;
  return std::unique_ptr<GrpcTransport>(new GrpcTransport(service, std::move(o), std::move(box)));
}

GrpcTransport::GrpcTransport(CollectiveService* service, GrpcTransportOptions o, std::shared_ptr<Mailbox> box)
    : service_(service), o_(std::move(o)), box_(std::move(box)) {
  for (int p = 0; p < size(); ++p) {
    if (p == o_.rank) {
      stubs_.push_back(nullptr);
    } else {
      stubs_.push_back(v1::Collective::NewStub(
          security::DataPlaneChannel(o_.addresses[p], LonghaulChannelArgs(), o_.names.empty() ? "" : o_.names[p])));
    }
    shapers_.push_back(std::make_unique<PeerShaper>(o_.links.empty() ? netem::LinkProfile{} : o_.links[p]));
  }
}

GrpcTransport::~GrpcTransport() {
  service_->Unregister(o_.group, o_.rank);
  box_->Abort(absl::CancelledError("the transport was closed"));
}

std::string GrpcTransport::PeerName(int peer) const {
  if (peer < 0 || peer >= size()) return absl::StrCat("rank ", peer);
  if (o_.names.empty()) return absl::StrCat("rank ", peer, " (", o_.addresses[peer], ")");
  return absl::StrCat("rank ", peer, " (", o_.names[peer], " at ", o_.addresses[peer], ")");
}

absl::Status GrpcTransport::SendMessage(int peer, uint64_t tag, absl::string_view data, absl::Time deadline,
                                        bool wait_for_ready, int64_t* wire_bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ctx.set_wait_for_ready(wait_for_ready);
  // A message (not an abort notice) is cancelled by this rank's Abort: a sender waiting for a dead
  // peer to come back must not outlive the group's abort by the message's deadline.
  const bool cancellable = tag != kAbortTag;
  if (cancellable) {
    absl::MutexLock l(&mu_);
    // Checked under mu_: Abort aborts the mailbox before it cancels what is registered here.
    if (absl::Status a = box_->aborted(); !a.ok()) return a;
    in_flight_.insert(&ctx);
  }
  auto unregister = absl::MakeCleanup([&] {
    if (!cancellable) return;
    absl::MutexLock l(&mu_);
    in_flight_.erase(&ctx);
  });
  v1::CollectiveAck ack;
  std::unique_ptr<grpc::ClientWriter<v1::CollectiveChunk>> w = stubs_[peer]->Send(&ctx, &ack);
  v1::CollectiveChunk c;
  c.set_group(o_.group);
  c.set_from_rank(static_cast<uint32_t>(o_.rank));
  c.set_to_rank(static_cast<uint32_t>(peer));
  c.set_tag(tag);
  c.set_total_bytes(data.size());
  const uint64_t count = CollectiveChunkCount(data.size());
  c.set_chunk_count(static_cast<uint32_t>(count));
  c.set_crc32c(codec::Crc32c(data.data(), data.size()));
  PeerShaper& shaper = *shapers_[peer];
  absl::Time arrival = absl::Now();
  bool ok = true;
  for (uint64_t i = 0; i < count && ok; ++i) {
    const size_t off = static_cast<size_t>(i * kCollectiveChunkBytes);
    const size_t len = std::min<size_t>(kCollectiveChunkBytes, data.size() - off);
    c.set_chunk_index(static_cast<uint32_t>(i));
    c.set_data(data.data() + off, len);
    if (shaper.shaped()) arrival = shaper.Admit(static_cast<int64_t>(len));
    // An abort notice (not cancellable: a few hundred bytes) is not paced: it must not wait behind
    // the data this rank's senders have been charged for.
    if (shaper.paced() && cancellable) shaper.PaceChunk(static_cast<int64_t>(len));
    *wire_bytes += static_cast<int64_t>(c.ByteSizeLong()) + kGrpcMessagePrefixBytes;
    ok = w->Write(c);
  }
  absl::Status shaped = absl::OkStatus();
  if (ok && shaper.shaped()) {
    // The emulated link delivers the last chunk at `arrival`; the message is not the receiver's
    // before then. This rank's Abort ends the wait of a message (not of an abort notice).
    shaped = SleepUntil(arrival, deadline, "the shaped link delivers the message", cancellable ? box_.get() : nullptr);
    if (!shaped.ok()) ctx.TryCancel();
  }
  if (ok && shaped.ok()) w->WritesDone();
  const grpc::Status st = w->Finish();
  if (!shaped.ok()) return shaped;
  if (st.error_code() == grpc::StatusCode::CANCELLED && cancellable) {
    if (absl::Status a = box_->aborted(); !a.ok()) return a;
  }
  return FromGrpc(st);
}

absl::Status GrpcTransport::Send(int peer, uint64_t tag, absl::string_view data, absl::Time deadline) {
  if (peer < 0 || peer >= size() || peer == o_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, " cannot send to rank ", peer));
  }
  const absl::Time t0 = absl::Now();
  int64_t wire = 0;
  absl::Status s = box_->aborted();
  // NOT_FOUND: the peer's server has no such rank of this group yet. The members of a group
  // create it when their stage starts, which on a loaded machine or after a long set-up may be a
  // little later than this one: try again until the deadline (refused at the first chunk, so
  // nothing of the message was taken).
  for (absl::Duration backoff = absl::Milliseconds(10); s.ok();) {
    wire = 0;
    s = SendMessage(peer, tag, data, deadline, /*wait_for_ready=*/true, &wire);
    if (!absl::IsNotFound(s) || absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
    s = box_->aborted();  // OK: try again
  }
  absl::MutexLock l(&mu_);
  counters_.send_time += absl::Now() - t0;
  counters_.wire_bytes_sent += wire;
  if (!s.ok()) {
    // A peer whose certificate is not the named worker's looks like one that never came up.
    const bool name_checked = security::DataPlaneTls() && !o_.names.empty();
    return absl::Status(s.code(), absl::StrCat("sending ", data.size(), " bytes (tag ", tag, ") to ", PeerName(peer),
                                               ": ", s.message(),
                                               absl::IsDeadlineExceeded(s) && name_checked
                                                   ? absl::StrCat(" (down, or its TLS certificate is not worker ",
                                                                  o_.names[peer], "'s)")
                                                   : ""));
  }
  ++counters_.messages_sent;
  counters_.bytes_sent += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcTransport::Recv(int peer, uint64_t tag, absl::Time deadline) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> m = box_->Take(peer, tag, deadline);
  absl::MutexLock l(&mu_);
  counters_.recv_wait += absl::Now() - t0;
  if (!m.ok()) {
    return absl::Status(m.status().code(), absl::StrCat("receiving tag ", tag, " from ", PeerName(peer), ": ",
                                                        m.status().message()));
  }
  ++counters_.messages_received;
  counters_.bytes_received += static_cast<int64_t>(m->size());
  return m;
}

void GrpcTransport::Abort(const absl::Status& why) {
  box_->Abort(why);
  const std::string text = std::string(why.ToString()).substr(0, kMaxAbortBytes);
  const absl::Time deadline = absl::Now() + o_.notice_timeout;
  // In parallel, so a dead peer costs one timeout, not one per peer. Fail fast: a peer that is not
  // connected now is not waited for.
  std::vector<std::thread> threads;
  for (int p = 0; p < size(); ++p) {
    if (p == o_.rank) continue;
    threads.emplace_back([this, p, &text, deadline] {
      int64_t wire = 0;
      (void)SendMessage(p, kAbortTag, text, deadline, /*wait_for_ready=*/false, &wire);
    });
  }
  for (std::thread& t : threads) t.join();
  // Then this rank's messages still being sent (e.g. waiting for a dead peer to come back): after
  // the notices, so that a live peer whose message is cut off has the reason first.
  absl::MutexLock l(&mu_);
  for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
}

std::vector<std::string> GrpcTransport::UnreachablePeers(absl::Time deadline) {
  deadline = std::min(deadline, absl::Now() + o_.notice_timeout);
  std::vector<std::string> why(static_cast<size_t>(size()));
  std::vector<std::thread> threads;
  for (int p = 0; p < size(); ++p) {
    if (p == o_.rank) continue;
    threads.emplace_back([this, p, deadline, &why] {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      v1::CollectivePingRequest req;
      req.set_group(o_.group);
      req.set_to_rank(static_cast<uint32_t>(p));
      v1::CollectivePingReply reply;
      const grpc::Status st = stubs_[p]->Ping(&ctx, req, &reply);
      if (!st.ok()) why[p] = absl::StrCat(PeerName(p), ": ", FromGrpc(st).ToString());
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> out;
  for (std::string& w : why) {
    if (!w.empty()) out.push_back(std::move(w));
  }
  return out;
}

TransportCounters GrpcTransport::counters() const {
  absl::MutexLock l(&mu_);
  return counters_;
}

}  // namespace longhaul::collective
