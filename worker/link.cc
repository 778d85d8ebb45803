#include "worker/link.h"

#include <malloc.h>

#include <cstring>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "codec/torch_status.h"

namespace longhaul::worker {

// ----------------------------------------------------------------------------------------- Inbox

Inbox::Inbox(size_t capacity, std::string peer) : capacity_(capacity < 1 ? 1 : capacity), peer_(std::move(peer)) {}

bool Inbox::SetStripes(int stripes) {
  absl::MutexLock l(&mu_);
  if (stripes < 1 || stripes > kMaxStripes) return false;
  if (stripes_set_) return stripes == stripes_;
  // Before any stream arrived nothing was pushed or popped, so the deal starts at stream 0.
  stripes_ = stripes;
  stripes_set_ = true;
  return true;
}

bool Inbox::Push(InFrame f, int stripe) {
  absl::MutexLock l(&mu_);
  if (stripe < 0 || stripe >= stripes_) return false;
  const size_t k = static_cast<size_t>(stripes_);
  const size_t share = (capacity_ + k - 1) / k;  // this stream's part of the capacity
  auto room = [this, stripe, share]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return q_[stripe].size() < share || !cancelled_.ok();
  };
  mu_.Await(absl::Condition(&room));
  if (!cancelled_.ok()) return false;
  q_[stripe].push_back(std::move(f));
  return true;
}

absl::StatusOr<InFrame> Inbox::Pop(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const size_t s = popped_ % static_cast<uint64_t>(stripes_);
    return !q_[s].empty() || !closed_[s].ok() || !cancelled_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no frame from ", peer_, " for ", absl::FormatDuration(timeout)));
  }
  if (!cancelled_.ok()) return cancelled_;
  const size_t s = popped_ % static_cast<uint64_t>(stripes_);
  if (q_[s].empty()) return closed_[s];
  InFrame f = std::move(q_[s].front());
  q_[s].pop_front();
  ++popped_;
  return f;
}

void Inbox::Close(absl::Status why, int stripe) {
  absl::MutexLock l(&mu_);
  const absl::Status st = why.ok() ? absl::UnavailableError(absl::StrCat("link from ", peer_, " closed")) : why;
  for (int i = 0; i < kMaxStripes; ++i) {
    if ((stripe < 0 || stripe == i) && closed_[i].ok()) closed_[i] = st;
  }
}

void Inbox::Cancel(absl::Status why) {
  absl::MutexLock l(&mu_);
  if (cancelled_.ok()) cancelled_ = why.ok() ? absl::CancelledError("cancelled") : why;
}

void TuneAllocatorForLargeFrames() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);  // blocks below 64 MiB come from (and return to) the heap
  mallopt(M_TRIM_THRESHOLD, 256 << 20);  // and freed memory stays mapped up to 256 MiB
}

// ------------------------------------------------------------------------------------ LinkSender

LinkSender::LinkSender(const SenderOptions& o, const codec::Codec* codec) : opt_(o), codec_(codec) {}

absl::StatusOr<std::unique_ptr<LinkSender>> LinkSender::Start(const SenderOptions& o,
                                                              const codec::Codec* codec) {
  if (o.streams < 0 || o.streams > kMaxStripes) {
    return absl::InvalidArgumentError(absl::StrCat("link to ", o.peer, ": streams must be 1..", kMaxStripes));
  }
  std::unique_ptr<LinkSender> s(new LinkSender(o, codec));
  int n = std::max(1, o.streams);
  if (o.profile.shaped()) n = 1;  // the in-process shaper emulates one link
  for (int i = 0; i < n; ++i) {
    auto st = std::make_unique<Stripe>();
    st->channel = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), LonghaulChannelArgs());
    if (!st->channel->WaitForConnected(absl::ToChronoTime(absl::Now() + o.connect_timeout))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", o.peer, " within ",
                                                 absl::FormatDuration(o.connect_timeout)));
    }
    st->method = std::make_unique<grpc::internal::RpcMethod>(
        StageLinkStreamMethod(), grpc::internal::RpcMethod::BIDI_STREAMING, st->channel);
    st->ctx.AddMetadata(kStripeMetadata, absl::StrCat(i, "/", n));
    st->stream.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::FrameAck>::Create(
        st->channel.get(), *st->method, &st->ctx));
    if (!st->stream) return absl::UnavailableError(absl::StrCat("cannot open a stream to ", o.peer));
    s->stripes_.push_back(std::move(st));
  }
  {
    absl::MutexLock l(&s->mu_);
    s->encoded_.resize(static_cast<size_t>(n));
  }
  if (o.profile.shaped()) {
    netem::LinkProfile prof = o.profile;
    if (prof.burst_bytes <= 0) prof.burst_bytes = netem::DefaultBurstBytes(prof.rate_bytes_per_s);
    s->shaper_ = std::make_unique<netem::LinkShaper>(prof, o.clock);
  }
  // The delay line's thread exists before the sender thread, which checks for it.
  const netem::LinkProfile& pr = o.profile;
  if (pr.delay > absl::ZeroDuration() || pr.jitter > absl::ZeroDuration() || pr.loss > 0) {
    s->delayer_ = std::thread([p = s.get()] { p->DelayLoop(); });
  }
  s->encoder_ = std::thread([p = s.get()] { p->EncoderLoop(); });
  for (size_t i = 0; i < s->stripes_.size(); ++i) {
    s->stripes_[i]->sender = std::thread([p = s.get(), i] { p->SenderLoop(i); });
    s->stripes_[i]->acker = std::thread([p = s.get(), i] { p->AckLoop(i); });
  }
  return s;
}

LinkSender::~LinkSender() { Cancel(); }

void LinkSender::Fail(absl::Status s) {
  absl::MutexLock l(&mu_);
  if (failed_.ok()) failed_ = std::move(s);
}

absl::Status LinkSender::Enqueue(Item item) {
  absl::MutexLock l(&mu_);
  if (finished_) return absl::FailedPreconditionError(absl::StrCat("link to ", opt_.peer, " already finished"));
  auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return q_.size() + in_flight_ < opt_.queue_capacity || !failed_.ok();
  };
  const absl::Time t0 = absl::Now();
  mu_.Await(absl::Condition(&room));
  send_wait_ += absl::Now() - t0;
  if (!failed_.ok()) return failed_;
  q_.push_back(std::move(item));
  return absl::OkStatus();
}

absl::Status LinkSender::Send(uint64_t step, int micro_batch, v1::Direction dir, torch::Tensor t,
                              bool measure_error) {
  Item it;
  it.step = step;
  it.micro_batch = micro_batch;
  it.direction = dir;
  it.tensor = t.detach();
  it.measure_error = measure_error;
  return Enqueue(std::move(it));
}

absl::Status LinkSender::SendValue(uint64_t step, v1::Direction dir, double value) {
  Item it;
  it.step = step;
  it.direction = dir;
  it.value = value;
  return Enqueue(std::move(it));
}

absl::Status LinkSender::WriteFrame(const Item& item, const std::shared_ptr<const codec::FrameParts>& frame,
                                    size_t stripe) {
  const int64_t n = static_cast<int64_t>(frame->size());
  const int64_t count = std::max<int64_t>(1, (n + kChunkBytes - 1) / kChunkBytes);
  v1::TensorFrameChunk header;
  header.set_job_id(opt_.job_id);
  header.set_step(item.step);
  header.set_micro_batch(static_cast<uint32_t>(item.micro_batch));
  header.set_direction(item.direction);
  header.set_chunk_count(static_cast<uint32_t>(count));
  header.set_frame_bytes(static_cast<uint64_t>(n));
  header.set_from_stage(opt_.from_stage);
  absl::Duration shaped = absl::ZeroDuration();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t off = i * kChunkBytes;
    const int64_t len = std::min(kChunkBytes, n - off);
    header.set_chunk_index(static_cast<uint32_t>(i));
    grpc::ByteBuffer chunk = SerializeChunk(header, frame, static_cast<size_t>(off), static_cast<size_t>(len));
    if (!shaper_) {
      if (absl::Status s = Put(chunk, item.step, stripe); !s.ok()) return s;
      continue;
    }
    const absl::Time t0 = opt_.clock->Now();
    const absl::Time deliver = shaper_->Admit(len);
    shaped += opt_.clock->Now() - t0;
    if (!delayer_.joinable()) {
      if (absl::Status s = Put(chunk, item.step, stripe); !s.ok()) return s;
      continue;
    }
    absl::MutexLock l(&mu_);
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return line_bytes_ < kMaxDelayLineBytes || !failed_.ok();
    };
    mu_.Await(absl::Condition(&room));
    if (!failed_.ok()) return failed_;
    line_bytes_ += len;
    line_.push_back({std::move(chunk), item.step, len, deliver});
  }
  absl::MutexLock l(&mu_);
  stats_.shaper_wait_seconds += absl::ToDoubleSeconds(shaped);
  return absl::OkStatus();
}

absl::Status LinkSender::Put(const grpc::ByteBuffer& chunk, uint64_t step, size_t stripe) {
  if (!stripes_[stripe]->stream->Write(chunk)) {
    return absl::UnavailableError(absl::StrCat("link to ", opt_.peer, " broke while sending step ", step,
                                               " (the peer closed the stream or died)"));
  }
  return absl::OkStatus();
}

void LinkSender::DelayLoop() {
  for (;;) {
    Delayed d;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !line_.empty() || sender_done_ || !failed_.ok();
      };
      mu_.Await(absl::Condition(&ready));
      if (!failed_.ok() || line_.empty()) return;  // failed, or the sender is done and all is out
      d = std::move(line_.front());
      line_.pop_front();
    }
    const absl::Duration wait = d.deliver - opt_.clock->Now();
    if (wait > absl::ZeroDuration()) opt_.clock->SleepFor(wait);
    if (absl::Status s = Put(d.chunk, d.step, 0); !s.ok()) {  // shaped links have one stripe
      Fail(s);
      return;
    }
    // The bytes count against the line's bound until they are on the wire.
    absl::MutexLock l(&mu_);
    line_bytes_ -= d.bytes;
  }
}

template <typename T>
bool LinkSender::TakeFront(std::deque<T>* q, T* out) {
  auto ready = [this, q]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !q->empty() || !failed_.ok(); };
  mu_.Await(absl::Condition(&ready));
  if (!failed_.ok()) return false;
  *out = std::move(q->front());
  q->pop_front();
  return true;
}

absl::StatusOr<LinkSender::Encoded> LinkSender::Encode(Item item) const {
  Encoded e;
  codec::FrameParts parts;
  if (item.tensor.defined()) {
    codec::EncodeOptions eo;
    eo.threads = opt_.codec_threads;
    eo.seed = item.step;  // stochastic rounding differs per step, reproducibly
    absl::StatusOr<codec::FrameParts> f = codec_->EncodeParts(item.tensor, eo);
    if (!f.ok()) {
      return absl::Status(f.status().code(), absl::StrCat("encoding for ", opt_.peer, ": ", f.status().message()));
    }
    parts = std::move(*f);
    if (item.measure_error) {
      absl::StatusOr<double> err = CatchTorch("rel error", [&]() -> absl::StatusOr<double> {
        codec::DecodeOptions d;
        d.threads = opt_.codec_threads;
        auto y = codec::DecodeFrame(parts.Join(), d);
        if (!y.ok()) return y.status();
        const double n = item.tensor.norm().item<double>();
        return n > 0 ? (item.tensor.to(torch::kFloat32) - *y).norm().item<double>() / n : 0.0;
      });
      if (err.ok()) e.rel_error = *err;
    }
  } else {
    parts.head.resize(sizeof(double));
    std::memcpy(parts.head.data(), &item.value, sizeof(double));
  }
  // Shared with the chunks in flight, which reference it instead of copying it.
  e.frame = std::make_shared<const codec::FrameParts>(std::move(parts));
  e.item = std::move(item);
  return e;
}

// Encodes ahead of the sender so that the CRC and codec work of the next frame overlap the socket
// writes of this one (with a spare core the link then runs at the speed of the kernel's copy).
void LinkSender::EncoderLoop() {
  for (uint64_t k = 0;; ++k) {
    Item item;
    {
      absl::MutexLock l(&mu_);
      if (!TakeFront(&q_, &item)) return;
      if (!item.end) ++in_flight_;
    }
    if (item.end) {
      // Every stripe's sender gets an end marker after its last frame.
      absl::MutexLock l(&mu_);
      for (std::deque<Encoded>& q : encoded_) {
        Encoded e;
        e.item.end = true;
        q.push_back(std::move(e));
      }
      return;
    }
    absl::StatusOr<Encoded> enc = Encode(std::move(item));
    if (!enc.ok()) {
      Fail(enc.status());
      return;
    }
    absl::MutexLock l(&mu_);
    std::deque<Encoded>& q = encoded_[k % encoded_.size()];
    auto room = [this, &q]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return q.size() < kEncodedAhead || !failed_.ok(); };
    mu_.Await(absl::Condition(&room));
    if (!failed_.ok()) return;
    q.push_back(std::move(*enc));
  }
}

void LinkSender::SenderLoop(size_t stripe) {
  for (;;) {
    Encoded e;
    {
      absl::MutexLock l(&mu_);
      if (!TakeFront(&encoded_[stripe], &e)) return;
    }
    if (e.item.end) return;
    if (absl::Status s = WriteFrame(e.item, e.frame, stripe); !s.ok()) {
      Fail(s);
      return;
    }
    absl::MutexLock l(&mu_);
    --in_flight_;
    if (e.item.tensor.defined()) {
      stats_.frames++;
      stats_.raw_bytes += e.item.tensor.numel() * 4;
      stats_.wire_bytes += static_cast<int64_t>(e.frame->size());
      if (e.rel_error >= 0) {
        stats_.error_samples++;
        stats_.sum_rel_error += e.rel_error;
      }
    }
  }
}

void LinkSender::AckLoop(size_t stripe) {
  v1::FrameAck ack;
  while (stripes_[stripe]->stream->Read(&ack)) {
    if (!ack.error().empty()) {
      Fail(absl::DataLossError(absl::StrCat(opt_.peer, " rejected a frame: ", ack.error())));
      CancelCalls();
      return;
    }
  }
  absl::MutexLock l(&mu_);
  if (failed_.ok() && !finished_) {
    failed_ = absl::UnavailableError(absl::StrCat("link to ", opt_.peer, " closed by the peer"));
  }
}

void LinkSender::CancelCalls() {
  for (const std::unique_ptr<Stripe>& st : stripes_) st->ctx.TryCancel();
}

absl::Status LinkSender::Finish() {
  {
    absl::MutexLock l(&mu_);
    if (finished_) return failed_;
    Item end;
    end.end = true;
    q_.push_back(std::move(end));
  }
  if (encoder_.joinable()) encoder_.join();
  for (const std::unique_ptr<Stripe>& st : stripes_) {
    if (st->sender.joinable()) st->sender.join();
  }
  {
    absl::MutexLock l(&mu_);
    sender_done_ = true;
  }
  if (delayer_.joinable()) delayer_.join();  // everything in the delay line goes out first
  absl::Status st;
  {
    absl::MutexLock l(&mu_);
    finished_ = true;
    st = failed_;
  }
  for (const std::unique_ptr<Stripe>& sp : stripes_) {
    if (st.ok()) sp->stream->WritesDone();
    else sp->ctx.TryCancel();
  }
  for (const std::unique_ptr<Stripe>& sp : stripes_) {
    if (sp->acker.joinable()) sp->acker.join();
    grpc::Status gs = sp->stream->Finish();
    if (st.ok() && !gs.ok()) {
      st = absl::UnavailableError(absl::StrCat("link to ", opt_.peer, " ended with: ", gs.error_message()));
    }
  }
  return st;
}

void LinkSender::Cancel() {
  auto joinable = [this] {
    bool any = encoder_.joinable() || delayer_.joinable();
    for (const std::unique_ptr<Stripe>& st : stripes_) any = any || st->sender.joinable() || st->acker.joinable();
    return any;
  };
  {
    absl::MutexLock l(&mu_);
    if (finished_ && !joinable()) return;
    finished_ = true;
    if (failed_.ok()) failed_ = absl::CancelledError("link cancelled");
  }
  CancelCalls();
  if (encoder_.joinable()) encoder_.join();
  for (const std::unique_ptr<Stripe>& st : stripes_) {
    if (st->sender.joinable()) st->sender.join();
  }
  if (delayer_.joinable()) delayer_.join();
  for (const std::unique_ptr<Stripe>& st : stripes_) {
    if (st->acker.joinable()) st->acker.join();
  }
}

void LinkSender::Abort(absl::Status why) {
  Fail(std::move(why));
  CancelCalls();
}

LinkStats LinkSender::stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

absl::Duration LinkSender::TakeSendWait() {
  absl::MutexLock l(&mu_);
  absl::Duration d = send_wait_;
  send_wait_ = absl::ZeroDuration();
  return d;
}

// ------------------------------------------------------------------------------- receiving side

absl::StatusOr<InFrame> DecodeInFrame(const v1::TensorFrameChunk& first, std::shared_ptr<std::string> frame,
                                      std::optional<uint32_t> frame_crc) {
  const std::string& bytes = *frame;
  InFrame f;
  f.step = first.step();
  f.micro_batch = static_cast<int>(first.micro_batch());
  f.direction = first.direction();
  switch (first.direction()) {
    case v1::DIRECTION_FORWARD:
    case v1::DIRECTION_BACKWARD: {
      codec::DecodeOptions o;
      o.frame_crc = frame_crc;
      absl::StatusOr<torch::Tensor> t = codec::DecodeSharedFrame(std::move(frame), o);
      if (!t.ok()) return t.status();
      f.tensor = std::move(*t);
      return f;
    }
    case v1::DIRECTION_NORM_PARTIAL:
    case v1::DIRECTION_NORM_TOTAL:
      if (bytes.size() != sizeof(double)) {
        return absl::InvalidArgumentError(absl::StrCat("norm frame of ", bytes.size(), " bytes (want 8)"));
      }
      std::memcpy(&f.value, bytes.data(), sizeof(double));
      if (!std::isfinite(f.value) || f.value < 0) {
        return absl::InvalidArgumentError(absl::StrCat("norm frame carries ", f.value));
      }
      return f;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown direction ", static_cast<int>(first.direction())));
  }
}

// Reassembly buffers are recycled: a fresh multi-MiB allocation per frame costs page faults and
// zeroing in the kernel (mmap'd by malloc at this size) that showed as ~10% of a loopback
// transfer's CPU time. A buffer returns here when the last tensor aliasing it is freed.
class FrameBufferPool : public std::enable_shared_from_this<FrameBufferPool> {
 public:
  std::shared_ptr<std::string> Get(size_t capacity) {
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

 private:
  static constexpr size_t kMaxFree = 16;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;
  void Put(std::string* s) {
    std::unique_ptr<std::string> b(s);
    if (b->capacity() > kMaxKeptBytes) return;
    absl::MutexLock l(&mu_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(b));
  }
  absl::Mutex mu_;
  std::vector<std::unique_ptr<std::string>> free_ ABSL_GUARDED_BY(mu_);
};

namespace {

// Accumulates the chunks of one frame, checking every field against the first chunk and bounds.
class Reassembler {
 public:
  Reassembler(int64_t max_frame_bytes, std::shared_ptr<FrameBufferPool> pool)
      : max_(max_frame_bytes), pool_(std::move(pool)) {}

  // Returns true when the chunk completed a frame (then first() and TakeBytes() give it).
  absl::StatusOr<bool> Add(const ParsedChunk& pc) {
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
               c.job_id() != first_.job_id() || c.from_stage() != first_.from_stage()) {
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
      return absl::InvalidArgumentError(absl::StrCat("frame has ", bytes_->size(), " bytes, header said ", first_.frame_bytes()));
    }
    return true;
  }
  const v1::TensorFrameChunk& first() const { return first_; }
  // The completed frame; the caller takes it (the next frame gets a new buffer).
  std::shared_ptr<std::string> TakeBytes() { return std::move(bytes_); }
  // The completed frame's checksum, computed as its chunks were copied in.
  std::optional<uint32_t> crc() const { return crc_.Value(); }

 private:
  const int64_t max_;
  const std::shared_ptr<FrameBufferPool> pool_;
  uint32_t next_ = 0;
  v1::TensorFrameChunk first_;
  std::shared_ptr<std::string> bytes_;
  codec::FrameCrc crc_;
};

}  // namespace

StageLinkService::StageLinkService(InboxRouter* router, int64_t max_frame_bytes)
    : router_(router), max_frame_bytes_(max_frame_bytes), buffers_(std::make_shared<FrameBufferPool>()) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      StageLinkStreamMethod(), grpc::internal::RpcMethod::BIDI_STREAMING,
      new grpc::internal::BidiStreamingHandler<StageLinkService, grpc::ByteBuffer, v1::FrameAck>(
          [](StageLinkService* svc, grpc::ServerContext* ctx,
             grpc::ServerReaderWriter<v1::FrameAck, grpc::ByteBuffer>* stream) { return svc->Stream(ctx, stream); },
          this)));
}

namespace {

// Chunks handed from a stream's reader (the gRPC handler thread) to its assembler thread. Bounded:
// when the assembler falls behind, the reader stops reading and HTTP/2 flow control pushes back.
class ChunkQueue {
 public:
  struct Item {
    ParsedChunk chunk;
    absl::Status error;  // the reader could not parse a message: the assembler rejects the stream
  };
  // False when the assembler has stopped (it failed; the reader should stop too).
  bool Push(Item it) {
    absl::MutexLock l(&mu_);
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return q_.size() < kCapacity || stopped_; };
    mu_.Await(absl::Condition(&room));
    if (stopped_) return false;
    q_.push_back(std::move(it));
    return true;
  }
  // Nothing more will be pushed.
  void End() {
    absl::MutexLock l(&mu_);
    ended_ = true;
  }
  // The next item, or nullopt once the queue is empty and ended.
  std::optional<Item> Pop() {
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !q_.empty() || ended_; };
    mu_.Await(absl::Condition(&ready));
    if (q_.empty()) return std::nullopt;
    Item it = std::move(q_.front());
    q_.pop_front();
    return it;
  }
  void Stop() {
    absl::MutexLock l(&mu_);
    stopped_ = true;
  }

 private:
  static constexpr size_t kCapacity = 4;  // chunks of up to kChunkBytes
  absl::Mutex mu_;
  std::deque<Item> q_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// Two threads per stream. The handler thread reads messages and parses their headers (no payload
// copy); the assembler thread copies payloads into the reassembly buffer, verifies and decodes
// complete frames, pushes them to the inbox and writes the error ack if any (the one writer). The
// socket is drained while the previous chunk is copied and checked: with a spare core the stream
// runs at the speed of the kernel's receive copy instead of that plus a copy and a CRC pass.
grpc::Status StageLinkService::Stream(grpc::ServerContext* ctx,
                                      grpc::ServerReaderWriter<v1::FrameAck, grpc::ByteBuffer>* stream) {
  grpc::ByteBuffer msg;
  if (!stream->Read(&msg)) return grpc::Status::OK;
  absl::StatusOr<ParsedChunk> first = ParseChunk(msg);
  if (!first.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(first.status().message()));
  // Which stream of a striped link this is ("<index>/<count>"; absent: 0 of 1).
  int stripe = 0, stripes = 1;
  if (auto m = ctx->client_metadata().find(kStripeMetadata); m != ctx->client_metadata().end()) {
    const std::string v(m->second.data(), m->second.size());
    std::vector<std::string> parts = absl::StrSplit(v, '/');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &stripe) || !absl::SimpleAtoi(parts[1], &stripes) ||
        stripes < 1 || stripes > kMaxStripes || stripe < 0 || stripe >= stripes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("bad ", kStripeMetadata, " metadata \"", v, "\" (want <index>/<count>, count <= ",
                                       kMaxStripes, ")"));
    }
  }
  absl::StatusOr<std::shared_ptr<Inbox>> found =
      router_->Find(first->header.job_id(), first->header.from_stage(), absl::Seconds(30));
  if (!found.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(found.status().message()));
  }
  const std::shared_ptr<Inbox> inbox = *found;
  if (!inbox->SetStripes(stripes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("stream ", stripe, "/", stripes, " does not match the link's stripe count"));
  }
  ChunkQueue chunks;
  grpc::Status result = grpc::Status::OK;  // written by the assembler, read after joining it
  std::thread assembler([&] {
    Reassembler r(max_frame_bytes_, buffers_);
    v1::TensorFrameChunk last;  // the last chunk that parsed, named in a rejection
    // The reader stops at its next message (or when the sender, told by the error ack or gone,
    // ends the stream); the call then ends with `s`.
    auto stop = [&](grpc::Status s) {
      result = std::move(s);
      chunks.Stop();
    };
    auto reject = [&](const absl::Status& s) {
      v1::FrameAck ack;
      ack.set_step(last.step());
      ack.set_micro_batch(last.micro_batch());
      ack.set_direction(last.direction());
      ack.set_error(std::string(s.message()));
      stream->Write(ack);
      inbox->Close(absl::DataLossError(absl::StrCat("bad frame from ", inbox->peer(), ": ", s.message())));
      stop(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message())));
    };
    while (std::optional<ChunkQueue::Item> it = chunks.Pop()) {
      if (!it->error.ok()) return reject(it->error);
      last = it->chunk.header;
      absl::StatusOr<bool> done = r.Add(it->chunk);
      if (!done.ok()) return reject(done.status());
      if (!*done) continue;
      absl::StatusOr<InFrame> f = DecodeInFrame(r.first(), r.TakeBytes(), r.crc());
      if (!f.ok()) return reject(f.status());
      // Accepted frames are not acknowledged: an ack would queue behind this host's own uploads
      // on a slow access link, and the sync Write would hold up the next frame's delivery (in the
      // tc sweep, fp32 went from 0.90 to 0.95 of the goodput bound without them). A clean end of
      // the stream is the sender's confirmation that everything arrived.
      if (!inbox->Push(std::move(*f), stripe)) {
        return stop(grpc::Status(grpc::StatusCode::CANCELLED, "job cancelled"));
      }
    }
  });
  bool more = chunks.Push({std::move(*first), absl::OkStatus()});
  while (more && stream->Read(&msg)) {
    absl::StatusOr<ParsedChunk> next = ParseChunk(msg);
    if (!next.ok()) {
      chunks.Push({ParsedChunk(), next.status()});
      break;
    }
    more = chunks.Push({std::move(*next), absl::OkStatus()});
  }
  chunks.End();
  assembler.join();
  if (!result.ok()) return result;
  // A sender that finished cleanly half-closed the stream; one that died cancelled it. Either way
  // nothing more comes on it; a Pop that still needs a frame from it learns why.
  if (ctx->IsCancelled()) {  // a broken stream breaks the whole link
    inbox->Close(absl::UnavailableError(absl::StrCat("link from ", inbox->peer(), " broke (peer died or cancelled)")));
  } else {
    inbox->Close(absl::UnavailableError(absl::StrCat("link from ", inbox->peer(), " closed")), stripe);
  }
  return grpc::Status::OK;
}

}  // namespace longhaul::worker
