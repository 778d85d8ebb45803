#include "stage_runtime/in_process_link.h"

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::StatusOr<torch::Tensor> CodecRoundTrip(const codec::Codec& codec, const torch::Tensor& x,
                                             const codec::EncodeOptions& options, bool measure_error,
                                             LinkStats* stats) {
  absl::StatusOr<std::string> frame = codec.Encode(x, options);
  if (!frame.ok()) return frame.status();
  codec::DecodeOptions d;
  d.threads = options.threads;
  absl::StatusOr<torch::Tensor> y = codec::DecodeFrame(*frame, d);
  if (!y.ok()) return y.status();
  if (stats != nullptr) {
    stats->frames++;
    stats->raw_bytes += x.numel() * 4;
    stats->wire_bytes += static_cast<int64_t>(frame->size());
    if (measure_error) {
      stats->error_samples++;
      stats->sum_rel_error += RelativeL2Error(x, *y);
    }
  }
  return y;
}

InProcessLink::InProcessLink(std::string self, std::string peer, const codec::Codec* codec, int codec_threads,
                             std::shared_ptr<Queue> out, std::shared_ptr<Queue> in)
    : self_(std::move(self)),
      peer_(std::move(peer)), codec_(codec), codec_threads_(codec_threads), out_(std::move(out)), in_(std::move(in)) {}

std::pair<std::unique_ptr<InProcessLink>, std::unique_ptr<InProcessLink>> InProcessLink::Pair(
    int stage, const codec::Codec* forward, const codec::Codec* backward, size_t capacity, int codec_threads) {
  auto down = std::make_shared<Queue>(capacity);  // stage -> stage + 1
  auto up = std::make_shared<Queue>(capacity);    // stage + 1 -> stage
  std::unique_ptr<InProcessLink> first(
      new InProcessLink(absl::StrCat("stage ", stage), absl::StrCat("stage ", stage + 1), forward, codec_threads, down, up));
  std::unique_ptr<InProcessLink> second(
      new InProcessLink(absl::StrCat("stage ", stage + 1), absl::StrCat("stage ", stage), backward, codec_threads, up, down));
  return {std::move(first), std::move(second)};
}

absl::Status InProcessLink::Send(LinkMessage m, bool measure_error) {
  if (m.tensor.defined()) {
    codec::EncodeOptions eo;
    eo.threads = codec_threads_;
    eo.seed = m.step;  // as LinkSender: stochastic rounding differs per step, reproducibly
    LinkStats frame;
    absl::StatusOr<torch::Tensor> y = CodecRoundTrip(*codec_, m.tensor, eo, measure_error, &frame);
    if (!y.ok()) return absl::Status(y.status().code(), absl::StrCat("link to ", peer_, ": ", y.status().message()));
    m.tensor = *std::move(y);
    absl::MutexLock l(&mu_);
    stats_.frames += frame.frames;
    stats_.raw_bytes += frame.raw_bytes;
    stats_.wire_bytes += frame.wire_bytes;
    stats_.error_samples += frame.error_samples;
    stats_.sum_rel_error += frame.sum_rel_error;
  }
  return out_->Push(std::move(m));
}

absl::StatusOr<LinkMessage> InProcessLink::Receive(absl::Duration timeout) {
  absl::StatusOr<LinkMessage> m = in_->Pop(timeout);
  if (!m.ok() && absl::IsDeadlineExceeded(m.status())) {
    return absl::DeadlineExceededError(absl::StrCat("nothing from ", peer_, " for ", absl::FormatDuration(timeout)));
  }
  return m;
}

absl::Status InProcessLink::Finish() {
  out_->Close(absl::UnavailableError(absl::StrCat("link from ", self_, " closed")));
  return absl::OkStatus();
}

void InProcessLink::Abort(absl::Status why) {
  out_->Cancel(why);
  in_->Cancel(why);
}

LinkStats InProcessLink::stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

absl::Duration InProcessLink::TakeSendWait() { return out_->TakePushWait(); }

}  // namespace longhaul::stage_runtime
