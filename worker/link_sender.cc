#include "worker/link_sender.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <c10/core/StreamGuard.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/spec.h"
#include "longhaul/v1/data_plane.pb.h"
#include "proto/channel_config.h"
#include "worker/chunk_wire.h"
#include "security/tls.h"

namespace longhaul::worker {

using stage_runtime::LinkMessage;

absl::StatusOr<std::unique_ptr<LinkSender>> LinkSender::Start(const SenderOptions& o,
                                                              const codec::Codec* codec) {
  if (o.streams < 1 || o.streams > kMaxStripes) {
    return absl::InvalidArgumentError(absl::StrCat("link to ", o.peer, ": streams must be 1..", kMaxStripes));
  }
  if ((o.profile.shaped() || o.profile.paced()) && o.streams != 1) {  // ResolveLinkSpec (link_settings.h) says so
    return absl::InvalidArgumentError(
        absl::StrCat("link to ", o.peer, ": a link shaped or paced in-process has one stream"));
  }
  std::unique_ptr<LinkSender> s(new LinkSender(o, codec));
  const int n = o.streams;
  for (int i = 0; i < n; ++i) {
    auto st = std::make_unique<Stripe>();
    st->channel = security::DataPlaneChannel(o.target, LonghaulChannelArgs(), o.peer_worker);
    if (!st->channel->WaitForConnected(absl::ToChronoTime(absl::Now() + o.connect_timeout))) {
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to ", o.peer, " within ", absl::FormatDuration(o.connect_timeout),
          security::DataPlaneTls() && !o.peer_worker.empty()
              ? absl::StrCat(" (down, or its TLS certificate is not worker ", o.peer_worker, "'s)")
              : ""));
    }
    st->stream = std::make_unique<LinkStream>(st->channel, StageLinkStreamMethod(),
                                              std::vector<std::pair<std::string, std::string>>{
                                                  {kStripeMetadata, absl::StrCat(i, "/", n)},
                                                  {kAttemptMetadata, absl::StrCat(o.attempt)}});
    s->stripes_.push_back(std::move(st));
    s->encoded_.push_back(std::make_unique<common::BoundedQueue<Encoded>>(kEncodedAhead));
  }
  if (o.profile.shaped()) {
    s->shaper_ = std::make_unique<netem::LinkShaper>(o.profile, o.clock);  // it applies the profile's defaults
  } else if (o.profile.paced()) {
    s->pacer_ = std::make_unique<netem::TokenBucket>(netem::LinkPacer(o.profile, o.clock));
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
  absl::Status why;
  {
    absl::MutexLock l(&mu_);  // waits on mu_ (Send, the delay line) see failed_
    if (failed_.ok()) failed_ = std::move(s);
    why = failed_;
  }
  for (const auto& q : encoded_) q->Cancel(why);  // the encoder and the senders
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

absl::StatusOr<bool> LinkSender::EncodeOnDevice(const torch::Tensor& t) const {
  if (!t.is_cuda()) return false;  // a CPU stage's link, whatever the job's codec_device says
  absl::StatusOr<bool> gpu = codec::EncodesOnGpu(t, opt_.codec_device);
  if (!gpu.ok()) return absl::FailedPreconditionError(absl::StrCat("link to ", opt_.peer, ": ", gpu.status().message()));
  if (!*gpu) return false;
  // A raw codec whose wire dtype is the tensor's has nothing to compute: its payload is the
  // tensor's bytes, which the DeviceCopier brings over asynchronously (a device encode would copy
  // them synchronously on the encoder thread).
  const codec::CodecTraits* tr = codec::CodecTraitsFor(codec_->id());
  if (tr != nullptr && tr->family == codec::CodecFamily::kRaw) {
    const torch::ScalarType wire = tr->wire_dtype == codec::FrameDtype::kFloat16    ? torch::kFloat16
                                   : tr->wire_dtype == codec::FrameDtype::kBFloat16 ? torch::kBFloat16
                                                                                     : torch::kFloat32;
    return wire != t.scalar_type();
  }
  return true;
}

absl::Status LinkSender::Send(LinkMessage m, bool measure_error) {
  const bool tensor = stage_runtime::CarriesTensor(m.kind);
  if (tensor != m.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("link to ", opt_.peer, ": ", stage_runtime::MessageKindName(m.kind),
                                                   tensor ? " message without a tensor" : " message with a tensor"));
  }
  Item it;
  if (tensor) {
    m.tensor = m.tensor.detach();
    absl::StatusOr<bool> on_device = EncodeOnDevice(m.tensor);
    if (!on_device.ok()) return on_device.status();
    if (*on_device) {
      // Kept as it is (the reference keeps its memory), with the link's stream ordered after the
      // compute queued before this call, which produced it (see the top of link_sender.h).
      absl::StatusOr<DeviceUse> use = copier_.StartDeviceUse(m.tensor);
      if (!use.ok()) {
        return absl::Status(use.status().code(), absl::StrCat("link to ", opt_.peer, ": ", use.status().message()));
      }
      it.on_device = true;
      it.device_use = *std::move(use);
    } else if (!m.tensor.device().is_cpu()) {
      // Started here, on compute's thread, so that it is ordered after the work that produced the
      // tensor and overlaps the work that follows; the encoder thread waits for it.
      absl::StatusOr<HostCopy> c = copier_.StartHostCopy(m.tensor);
      if (!c.ok()) {
        return absl::Status(c.status().code(), absl::StrCat("link to ", opt_.peer, ": ", c.status().message()));
      }
      it.copy = *std::move(c);
      m.tensor = torch::Tensor();  // the copy keeps the device memory from being reused until read
    }
  }
  it.msg = std::move(m);
  it.measure_error = measure_error && tensor;
  return Enqueue(std::move(it));
}

absl::StatusOr<LinkSender::Encoded> LinkSender::Encode(Item item) const {
  Encoded e;
  codec::FrameParts parts;
  if (item.copy.has_value()) {
    absl::StatusOr<torch::Tensor> host = item.copy->Wait();
    if (!host.ok()) {
      return absl::Status(host.status().code(), absl::StrCat("link to ", opt_.peer, ": ", host.status().message()));
    }
    item.msg.tensor = *std::move(host);
    item.copy.reset();
  }
  if (stage_runtime::CarriesTensor(item.msg.kind)) {
    codec::EncodeOptions eo;
    eo.threads = opt_.codec_threads;
    eo.seed = item.msg.step;  // stochastic rounding differs per step, reproducibly
    // Send chose the place; the tensor is on the CPU otherwise (a host copy or a CPU tensor).
    eo.device = item.on_device ? codec::CodecDevice::kGpu : codec::CodecDevice::kCpu;
    // On the link's stream, LibTorch's too for what the encode asks of it (casts, copies, the
    // error measurement below); none (the legacy default stream) for host tensors.
    std::optional<c10::StreamGuard> on_link;
    if (item.device_use.stream.has_value()) on_link.emplace(*item.device_use.stream);
    eo.cuda_stream = item.device_use.cuda_stream;
    e.elements = item.msg.tensor.numel();
    // Encode time is counted from a ready input to the frame's bytes on the host (the codec ends
    // with them there, so a host timer sees all of it). A host copy was waited for above; a
    // tensor encoded on its device may still be being computed, which the link's stream waits
    // for on the GPU: wait for that here, or the encode's own synchronisation would count the
    // stage's compute as encoding.
    if (item.device_use.stream.has_value()) {
      try {
        item.device_use.stream->synchronize();
      } catch (const c10::Error& err) {
        return absl::InternalError(absl::StrCat("encoding for ", opt_.peer, ": ", err.what_without_backtrace()));
      }
    }
    const absl::Time encode_start = absl::Now();
    absl::StatusOr<codec::FrameParts> f = codec_->EncodeParts(item.msg.tensor, eo);
    e.encode_seconds = absl::ToDoubleSeconds(absl::Now() - encode_start);
    if (!f.ok()) {
      return absl::Status(f.status().code(), absl::StrCat("encoding for ", opt_.peer, ": ", f.status().message()));
    }
    parts = *std::move(f);
    if (item.measure_error) {
      codec::DecodeOptions d;
      d.threads = opt_.codec_threads;
      // A tensor encoded on its device is compared there (decoded there when the GPU codecs are).
      if (item.on_device) {
        d.device = item.msg.tensor.device();
        d.cuda_stream = item.device_use.cuda_stream;
      }
      absl::StatusOr<torch::Tensor> y = codec::DecodeFrame(parts.Join(), d);
      if (y.ok()) e.rel_error = stage_runtime::RelativeL2Error(item.msg.tensor, *y);
    }
    // The frame is on the host now; the device memory goes back to compute at once instead of
    // waiting for the frame to be written.
    if (item.on_device) item.msg.tensor = torch::Tensor();
  } else {
    parts.head.resize(sizeof(double));
    std::memcpy(parts.head.data(), &item.msg.value, sizeof(double));
  }
  // Shared with the chunks in flight, which reference it instead of copying it.
  e.frame = std::make_shared<const codec::FrameParts>(std::move(parts));
  e.msg = std::move(item.msg);
  return e;
}

// Encodes ahead of the senders so that the CRC and codec work of the next frame overlap the socket
// writes of this one (with a spare core the link then runs at the speed of the kernel's copy).
void LinkSender::EncoderLoop() {
  const absl::Status end = absl::OutOfRangeError("end of link");
  for (uint64_t k = 0;; ++k) {
    Item item;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !q_.empty() || !failed_.ok(); };
      mu_.Await(absl::Condition(&ready));
      if (!failed_.ok()) return;
      item = std::move(q_.front());
      q_.pop_front();
      if (!item.end) ++in_flight_;
    }
    if (item.end) {
      for (const auto& q : encoded_) q->Close(end);  // each sender stops after its last frame
      return;
    }
    absl::StatusOr<Encoded> enc = Encode(std::move(item));
    if (!enc.ok()) {
      Fail(enc.status());
      return;
    }
    // Blocks while that stream is kEncodedAhead frames behind; fails once the link failed.
    if (!encoded_[k % encoded_.size()]->Push(*std::move(enc)).ok()) return;
  }
}

void LinkSender::SenderLoop(size_t stripe) {
  for (;;) {
    absl::StatusOr<Encoded> e = encoded_[stripe]->Pop();
    if (!e.ok()) return;  // the end of the link, or its failure (already recorded)
    if (absl::Status s = WriteFrame(*e, stripe); !s.ok()) {
      Fail(s);
      return;
    }
    absl::MutexLock l(&mu_);
    --in_flight_;
    if (stage_runtime::CarriesTensor(e->msg.kind)) {
      stats_.frames++;
      stats_.raw_bytes += e->elements * 4;
      stats_.wire_bytes += static_cast<int64_t>(e->frame->size());
      stats_.encode_seconds += e->encode_seconds;
      if (e->rel_error >= 0) {
        stats_.error_samples++;
        stats_.sum_rel_error += e->rel_error;
      }
    }
  }
}

absl::Status LinkSender::WriteFrame(const Encoded& e, size_t stripe) {
  const int64_t n = static_cast<int64_t>(e.frame->size());
  const int64_t count = std::max<int64_t>(1, (n + kChunkBytes - 1) / kChunkBytes);
  v1::TensorFrameChunk header;
  header.set_job_id(opt_.job_id);
  header.set_step(e.msg.step);
  header.set_micro_batch(static_cast<uint32_t>(e.msg.micro_batch));
  header.set_direction(ToDirection(e.msg.kind));
  header.set_chunk_count(static_cast<uint32_t>(count));
  header.set_frame_bytes(static_cast<uint64_t>(n));
  header.set_from_stage(opt_.from_stage);
  header.set_from_replica(opt_.from_replica);
  absl::Duration shaped = absl::ZeroDuration();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t off = i * kChunkBytes;
    const int64_t len = std::min(kChunkBytes, n - off);
    header.set_chunk_index(static_cast<uint32_t>(i));
    grpc::ByteBuffer chunk = SerializeChunk(header, e.frame, static_cast<size_t>(off), static_cast<size_t>(len));
    if (!shaper_) {
      if (pacer_) shaped += pacer_->Pace(len);
      if (absl::Status s = Put(&chunk, e.msg.step, stripe); !s.ok()) return s;
      continue;
    }
    const absl::Time t0 = opt_.clock->Now();
    const absl::Time deliver = shaper_->Admit(len);
    shaped += opt_.clock->Now() - t0;
    if (!delayer_.joinable()) {
      if (absl::Status s = Put(&chunk, e.msg.step, stripe); !s.ok()) return s;
      continue;
    }
    absl::MutexLock l(&mu_);
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return line_bytes_ < kMaxDelayLineBytes || !failed_.ok();
    };
    mu_.Await(absl::Condition(&room));
    if (!failed_.ok()) return failed_;
    line_bytes_ += len;
    Delayed& d = line_.emplace_back();
    d.chunk.Swap(&chunk);  // grpc::ByteBuffer has no move; a copy would re-reference every slice
    d.step = e.msg.step;
    d.bytes = len;
    d.deliver = deliver;
  }
  absl::MutexLock l(&mu_);
  stats_.shaper_wait_seconds += absl::ToDoubleSeconds(shaped);
  return absl::OkStatus();
}

absl::Status LinkSender::Put(grpc::ByteBuffer* chunk, uint64_t step, size_t stripe) {
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
      Delayed& front = line_.front();
      d.chunk.Swap(&front.chunk);
      d.step = front.step;
      d.bytes = front.bytes;
      d.deliver = front.deliver;
      line_.pop_front();
    }
    const absl::Duration wait = d.deliver - opt_.clock->Now();
    if (wait > absl::ZeroDuration()) opt_.clock->SleepFor(wait);
    if (absl::Status s = Put(&d.chunk, d.step, 0); !s.ok()) {  // shaped links have one stripe
      Fail(s);
      return;
    }
    // The bytes count against the line's bound until they are on the wire.
    absl::MutexLock l(&mu_);
    line_bytes_ -= d.bytes;
  }
}

// Receivers send acks only for rejected frames (data_plane.proto); one with an empty error is
// ignored.
void LinkSender::AckLoop(size_t stripe) {
  grpc::ByteBuffer msg;
  while (stripes_[stripe]->stream->Read(&msg)) {
    absl::StatusOr<v1::FrameAck> ack = ParseAck(&msg);
    if (!ack.ok()) {
      Fail(absl::DataLossError(absl::StrCat("from ", opt_.peer, ": ", ack.status().message())));
      CancelCalls();
      return;
    }
    if (!ack->error().empty()) {
      Fail(absl::DataLossError(absl::StrCat(opt_.peer, " rejected a frame: ", ack->error())));
      CancelCalls();
      return;
    }
  }
  {
    absl::MutexLock l(&mu_);
    if (!failed_.ok() || finished_) return;
  }
  Fail(absl::UnavailableError(absl::StrCat("link to ", opt_.peer, " closed by the peer")));
}

void LinkSender::CancelCalls() {
  for (const std::unique_ptr<Stripe>& st : stripes_) st->stream->TryCancel();
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
    // A failed last write shows in the call's status below.
    if (st.ok()) sp->stream->WritesDone();
    else sp->stream->TryCancel();
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
  }
  Fail(absl::CancelledError("link cancelled"));
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

stage_runtime::LinkStats LinkSender::stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

absl::Duration LinkSender::TakeSendWait() {
  absl::MutexLock l(&mu_);
  return std::exchange(send_wait_, absl::ZeroDuration());
}

size_t LinkSender::queue_depth() {
  absl::MutexLock l(&mu_);
  return q_.size() + in_flight_;
}

}  // namespace longhaul::worker
