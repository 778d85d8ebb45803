// Transport between the ranks of one process (tests, single-process drivers): a hub owns one
// Mailbox per rank and Send copies the buffer into the peer's. Optional link shaping per directed
// pair (netem::LinkProfile, paced like the gRPC transport's chunks), and Kill(rank) to emulate a
// dead peer: sends to it fail, nothing more comes from it, UnreachablePeers lists it.
//
//   InProcessHub hub(4);
//   std::unique_ptr<Transport> t0 = hub.Connect(0);   // one per rank, used by that rank's thread
#ifndef LONGHAUL_COLLECTIVE_IN_PROCESS_TRANSPORT_H_
#define LONGHAUL_COLLECTIVE_IN_PROCESS_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/transport.h"

namespace longhaul::collective {

struct InProcessHubOptions {
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  int64_t max_buffered_bytes = kDefaultMaxBufferedBytes;
  // The link from rank `from` to rank `to`; unset: unshaped.
  std::function<netem::LinkProfile(int from, int to)> link;
};

class InProcessHub {
 public:
  explicit InProcessHub(int size, InProcessHubOptions o = {});
  ~InProcessHub();
  int size() const { return size_; }
  // The transport of `rank` (call once per rank). It must not outlive the hub.
  std::unique_ptr<Transport> Connect(int rank);
  // The rank's process "dies": every later send to it fails and its own calls fail.
  void Kill(int rank);
  bool alive(int rank);

 private:
  friend class InProcessTransport;
  const int size_;
  const InProcessHubOptions options_;
  std::vector<std::shared_ptr<Mailbox>> boxes_;
  absl::Mutex mu_;
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::collective

#endif  // LONGHAUL_COLLECTIVE_IN_PROCESS_TRANSPORT_H_
