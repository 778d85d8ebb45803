// Link: a stage's connection to one neighbouring stage, the one interface the step loop
// (stage_loop.h) talks to, in the manner of gloo's transport::Pair. Two implementations:
//   InProcessLink (in_process_link.h)  a pair of bounded queues in one process; every tensor is
//                                      encoded and decoded with the link's codec on the way;
//   GrpcLink (worker/grpc_link.h)      a LinkSender (encode, shape, chunk, gRPC) to the neighbour
//                                      and the Inbox its frames arrive in.
//
// Per step a link carries, towards the next stage, one activation per micro-batch and the total
// squared gradient norm; towards the previous stage one activation gradient per micro-batch and
// the partial squared gradient norm. Messages arrive in the order they were sent.
//
// Threading: Send, Receive, Finish, stats and TakeSendWait are called by the owning stage's compute
// thread; Abort from any thread.
#ifndef LONGHAUL_STAGE_RUNTIME_LINK_H_
#define LONGHAUL_STAGE_RUNTIME_LINK_H_

#include <cstdint>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace longhaul::stage_runtime {

enum class MessageKind : uint8_t {
  kActivation,   // stage s -> s+1, a tensor per micro-batch
  kGradient,     // stage s+1 -> s, a tensor per micro-batch
  kNormPartial,  // stage s+1 -> s, the sum of squared gradient norms of stages s+1..S-1
  kNormTotal,    // stage s -> s+1, the sum over all stages
};
const char* MessageKindName(MessageKind k);  // "activation", "gradient", ...
inline bool CarriesTensor(MessageKind k) { return k == MessageKind::kActivation || k == MessageKind::kGradient; }

struct LinkMessage {
  uint64_t step = 0;
  int micro_batch = 0;  // 0 for the norm messages
  MessageKind kind = MessageKind::kActivation;
  torch::Tensor tensor;  // activations and gradients
  double value = 0;      // norms
};

// The two shapes of message: a tensor (activation, gradient) and a scalar (a norm).
inline LinkMessage TensorMessage(uint64_t step, int micro_batch, MessageKind kind, torch::Tensor t) {
  LinkMessage m;
  m.step = step;
  m.micro_batch = micro_batch;
  m.kind = kind;
  m.tensor = std::move(t);
  return m;
}
inline LinkMessage ValueMessage(uint64_t step, MessageKind kind, double value) {
  LinkMessage m;
  m.step = step;
  m.kind = kind;
  m.value = value;
  return m;
}

// Counters of a link's sending direction: raw = fp32 bytes of the tensors, wire = frame bytes.
struct LinkStats {
  int64_t frames = 0;
  int64_t raw_bytes = 0;
  int64_t wire_bytes = 0;
  int64_t error_samples = 0;  // frames whose round-trip error was measured
  double sum_rel_error = 0;   // sum over those of ||x - decode(encode(x))|| / ||x||
  double shaper_wait_seconds = 0;
  double encode_seconds = 0;  // encoding the frames sent (LinkSender; 0 on in-process links)
  double mean_rel_error() const { return error_samples ? sum_rel_error / error_samples : 0; }
};

// ||x - y|| / ||x|| in double precision (0 when x is all zeros). Any device, any float dtype.
double RelativeL2Error(const torch::Tensor& x, const torch::Tensor& y);

class Link {
 public:
  virtual ~Link() = default;

  // Queues a message for the neighbour; blocks only while the link's send queue is full.
  // `measure_error` also measures the codec's round-trip error of this tensor (LinkStats).
  virtual absl::Status Send(LinkMessage m, bool measure_error) = 0;
  // The neighbour's next message, in the order it sent them; fails when the link broke, was
  // aborted, or nothing came within `timeout` (messages name the peer).
  virtual absl::StatusOr<LinkMessage> Receive(absl::Duration timeout) = 0;
  // Delivers everything sent so far and closes the sending direction (OK: the neighbour got it all).
  virtual absl::Status Finish() = 0;
  // Makes blocked and later calls fail with `why`, on both directions. Any thread.
  virtual void Abort(absl::Status why) = 0;

  virtual LinkStats stats() = 0;
  // Time Send() spent blocked on a full queue since the last call.
  virtual absl::Duration TakeSendWait() = 0;
  // The neighbour, for messages ("stage 1 (worker w1 at host:port)").
  virtual const std::string& peer() const = 0;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_LINK_H_
