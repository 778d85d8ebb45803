// absl::Status <-> grpc::Status, for handlers that answer with an absl status and callers that
// return a gRPC call's outcome as one. The two share their code numbering.
#ifndef LONGHAUL_PROTO_GRPC_STATUS_H_
#define LONGHAUL_PROTO_GRPC_STATUS_H_

#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace longhaul {

inline grpc::Status ToGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_GRPC_STATUS_H_
