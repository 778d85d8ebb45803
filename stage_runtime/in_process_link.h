// InProcessLink: the Link between two stages of one process (InProcessPipeline). Each direction is
// a BoundedQueue of messages; a tensor is encoded with the direction's codec and decoded again on
// the sender's thread before it is queued, so the receiving stage sees exactly what a remote one
// would (same frames: the encode seed is the step, as on the network), and the link counts the
// frame bytes a network link would carry.
//
// Threading: each end is used by its stage's compute thread; Abort from any thread (it tears down
// both directions, waking the other end too).
#ifndef LONGHAUL_STAGE_RUNTIME_IN_PROCESS_LINK_H_
#define LONGHAUL_STAGE_RUNTIME_IN_PROCESS_LINK_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "codec/codec.h"
#include "common/bounded_queue.h"
#include "stage_runtime/link.h"

namespace longhaul::stage_runtime {

// Encodes `x` with `codec` and decodes the frame: what the receiving stage gets. Adds the frame to
// `stats` (and, when `measure_error`, the round-trip error); `stats` may be null.
absl::StatusOr<torch::Tensor> CodecRoundTrip(const codec::Codec& codec, const torch::Tensor& x,
                                             const codec::EncodeOptions& options, bool measure_error,
                                             LinkStats* stats);

class InProcessLink final : public Link {
 public:
  // The two ends of the link between stages s and s+1: `first` is stage s's end (it sends
  // activations with `forward`), `second` stage s+1's (it sends gradients with `backward`). Each
  // direction holds up to `capacity` messages. The codecs must outlive both ends.
  static std::pair<std::unique_ptr<InProcessLink>, std::unique_ptr<InProcessLink>> Pair(
      int stage, const codec::Codec* forward, const codec::Codec* backward, size_t capacity, int codec_threads);

  absl::Status Send(LinkMessage m, bool measure_error) override;
  absl::StatusOr<LinkMessage> Receive(absl::Duration timeout) override;
  absl::Status Finish() override;
  void Abort(absl::Status why) override;
  LinkStats stats() override;
  absl::Duration TakeSendWait() override;
  const std::string& peer() const override { return peer_; }

 private:
  using Queue = common::BoundedQueue<LinkMessage>;
  InProcessLink(std::string self, std::string peer, const codec::Codec* codec, int codec_threads,
                std::shared_ptr<Queue> out, std::shared_ptr<Queue> in);

  const std::string self_, peer_;  // "stage <i>" of this end and of the other
  const codec::Codec* const codec_;  // for the tensors this end sends
  const int codec_threads_;
  const std::shared_ptr<Queue> out_, in_;  // shared with the other end
  absl::Mutex mu_;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_IN_PROCESS_LINK_H_
