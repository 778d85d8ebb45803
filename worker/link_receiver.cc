#include "worker/link_receiver.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "codec/frame.h"
#include "common/log.h"
#include "proto/channel_config.h"

namespace longhaul::worker {

std::shared_ptr<std::string> FrameBufferPool::Get(size_t capacity) {
  std::unique_ptr<std::string> b;
  {
    absl::MutexLock l(&mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!b) b = std::make_unique<std::string>();
  b->clear();
  // Grow only: before C++20 reserve() may shrink, and an 8-byte norm frame would give back the
  // multi-MiB block the next tensor frame needs.
  if (b->capacity() < capacity) b->reserve(capacity);
  return std::shared_ptr<std::string>(b.release(), [pool = shared_from_this()](std::string* s) { pool->Put(s); });
}

void FrameBufferPool::Put(std::string* s) {
  std::unique_ptr<std::string> b(s);
  if (b->capacity() > kMaxKeptBytes) return;
  absl::MutexLock l(&mu_);
  if (free_.size() < kMaxFree) free_.push_back(std::move(b));
}

absl::StatusOr<bool> Reassembler::Add(const ParsedChunk& pc) {
  const v1::TensorFrameChunk& c = pc.header;
  if (next_ == 0) {
    if (c.chunk_index() != 0) return absl::InvalidArgumentError(absl::StrCat("frame starts at chunk ", c.chunk_index()));
    if (c.chunk_count() < 1) return absl::InvalidArgumentError("chunk_count 0");
    if (c.frame_bytes() > static_cast<uint64_t>(max_)) {
      return absl::ResourceExhaustedError(absl::StrCat("frame of ", c.frame_bytes(), " bytes exceeds the limit of ", max_));
    }
    if (c.frame_bytes() > uint64_t{c.chunk_count()} * kMaxMessageBytes) {
      return absl::InvalidArgumentError("frame_bytes larger than its chunks can carry");
    }
    first_ = c;
    bytes_ = pool_->Get(c.frame_bytes());  // the previous one went to the decoder
    crc_ = codec::FrameCrc();
  } else if (c.chunk_index() != next_ || c.chunk_count() != first_.chunk_count() ||
             c.frame_bytes() != first_.frame_bytes() || c.step() != first_.step() ||
             c.micro_batch() != first_.micro_batch() || c.direction() != first_.direction() ||
             c.job_id() != first_.job_id() || c.from_stage() != first_.from_stage() ||
             c.from_replica() != first_.from_replica()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk_index(), " does not continue frame (step ",
                                                   first_.step(), ", micro-batch ", first_.micro_batch(),
                                                   ", expected chunk ", next_, ")"));
  }
  if (bytes_->size() + pc.data_length > first_.frame_bytes()) {
    return absl::InvalidArgumentError("chunks carry more bytes than frame_bytes");
  }
  AppendChunkData(pc, bytes_.get(), &crc_);
  ++next_;
  if (next_ < first_.chunk_count()) return false;
  next_ = 0;
  if (bytes_->size() != first_.frame_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame has ", bytes_->size(), " bytes, header said ", first_.frame_bytes()));
  }
  return true;
}

void DecodeTimes::Add(stage_runtime::MessageKind kind, absl::Duration d) {
  (kind == stage_runtime::MessageKind::kActivation ? forward_ns_ : backward_ns_)
      .fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
}

double DecodeTimes::seconds(bool forward) const {
  return static_cast<double>((forward ? forward_ns_ : backward_ns_).load(std::memory_order_relaxed)) * 1e-9;
}

DecodeTarget DecodeTargetFor(const torch::Device& stage_device, codec::CodecDevice d) {
  DecodeTarget t;
  if (stage_device.is_cuda() && d != codec::CodecDevice::kCpu && codec::GpuCodecsAvailable()) {
    t.device = stage_device;
    t.codec_device = d;
  }
  return t;
}

absl::StatusOr<stage_runtime::LinkMessage> DecodeInFrame(const v1::TensorFrameChunk& first,
                                                         std::shared_ptr<std::string> frame,
                                                         std::optional<uint32_t> frame_crc,
                                                         const DecodeTarget& target) {
  absl::StatusOr<stage_runtime::MessageKind> kind = ToMessageKind(first.direction());
  if (!kind.ok()) return kind.status();
  stage_runtime::LinkMessage m;
  m.step = first.step();
  m.micro_batch = static_cast<int>(first.micro_batch());
  m.kind = *kind;
  if (stage_runtime::CarriesTensor(m.kind)) {
    codec::DecodeOptions o;
    o.frame_crc = frame_crc;
    o.device = target.device;
    o.codec_device = target.codec_device;
    const absl::Time start = absl::Now();
    absl::StatusOr<torch::Tensor> t = codec::DecodeSharedFrame(std::move(frame), o);
    if (!t.ok()) return t.status();
    if (target.times != nullptr) target.times->Add(m.kind, absl::Now() - start);
    m.tensor = *std::move(t);
    return m;
  }
  if (frame->size() != sizeof(double)) {
    return absl::InvalidArgumentError(absl::StrCat("norm frame of ", frame->size(), " bytes (want 8)"));
  }
  std::memcpy(&m.value, frame->data(), sizeof(double));
  if (!std::isfinite(m.value) || m.value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("norm frame carries ", m.value));
  }
  return m;
}

int64_t FrameLimitFor(int64_t micro_batch_size, int64_t context, int64_t hidden) {
  const double elements = static_cast<double>(micro_batch_size) * static_cast<double>(context) * static_cast<double>(hidden);
  const double bytes = static_cast<double>(codec::FrameHeaderBytes(3)) + 8 * elements + 65536;
  return bytes >= static_cast<double>(kDefaultMaxFrameBytes) ? kDefaultMaxFrameBytes : static_cast<int64_t>(bytes);
}

void StreamAdmission::Refused(const std::string& host, const std::string& what) {
  refusals_.Warn(host, absl::StrCat("limit hit: ", what, " from ", host, "; stream refused"));
}

absl::StatusOr<std::unique_ptr<StreamAdmission::Ticket>> StreamAdmission::Open(const std::string& grpc_peer) {
  std::string host = PeerHost(grpc_peer);
  absl::MutexLock l(&mu_);
  int& n = open_[host];
  if (n >= limits_.max_per_peer) {
    const std::string what = absl::StrCat("more than ", limits_.max_per_peer, " open data-plane streams");
    Refused(host, what);
    return absl::ResourceExhaustedError(absl::StrCat(what, " from ", host));
  }
  ++n;
  return std::make_unique<Ticket>(this, std::move(host));
}

StreamAdmission::Ticket::~Ticket() {
  absl::MutexLock l(&a_->mu_);
  auto it = a_->open_.find(host_);
  if (it != a_->open_.end() && --it->second <= 0) a_->open_.erase(it);
}

absl::Duration StreamAdmission::BeginWait(const std::string& grpc_peer) {
  absl::MutexLock l(&mu_);
  if (waiting_ >= limits_.max_waiting) {
    Refused(PeerHost(grpc_peer), absl::StrCat("more than ", limits_.max_waiting, " streams waiting for a job not running here"));
    return absl::ZeroDuration();
  }
  ++waiting_;
  return limits_.wait;
}

void StreamAdmission::EndWait() {
  absl::MutexLock l(&mu_);
  --waiting_;
}

}  // namespace longhaul::worker
