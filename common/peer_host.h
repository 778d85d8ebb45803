// The client host of a gRPC peer string, the key of every per-client limit (the coordinator's
// quotas, the worker's stream admission): a client opening new connections (new ports) is still
// the same host.
//   "ipv4:10.0.0.5:40312" -> "10.0.0.5", "ipv6:[::1]:5" -> "::1", "unix:/path" -> "unix:/path"
#ifndef LONGHAUL_COMMON_PEER_HOST_H_
#define LONGHAUL_COMMON_PEER_HOST_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace longhaul::common {

inline std::string GrpcPeerHost(const std::string& peer) {
  absl::string_view p(peer);
  if (absl::ConsumePrefix(&p, "ipv4:")) return std::string(p.substr(0, p.rfind(':')));
  if (absl::ConsumePrefix(&p, "ipv6:")) {
    p = p.substr(0, p.rfind(':'));
    absl::ConsumePrefix(&p, "[");
    absl::ConsumeSuffix(&p, "]");
    return std::string(p);
  }
  return peer;
}

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_PEER_HOST_H_
