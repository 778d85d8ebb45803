// gRPC settings shared by every longhaul channel and server (control and data plane alike):
// explicit message-size limits, keepalive so a silent dead peer is noticed, and the server-side
// keepalive policy that lets those pings through.
#ifndef LONGHAUL_PROTO_CHANNEL_CONFIG_H_
#define LONGHAUL_PROTO_CHANNEL_CONFIG_H_

#include <grpcpp/grpcpp.h>

namespace longhaul {

// Largest gRPC message longhaul sends or accepts. Tensor frames travel in 1 MiB chunks below it.
inline constexpr int kMaxMessageBytes = 4 << 20;

grpc::ChannelArguments LonghaulChannelArgs();
void ConfigureLonghaulServer(grpc::ServerBuilder* b);

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_CHANNEL_CONFIG_H_
