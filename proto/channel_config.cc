#include "proto/channel_config.h"

namespace longhaul {

grpc::ChannelArguments LonghaulChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Each link gets its own TCP connection (no sharing with the control plane or other links), so a
  // slow link's window never stalls another.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

void ConfigureLonghaulServer(grpc::ServerBuilder* b) {
  b->SetMaxReceiveMessageSize(kMaxMessageBytes);
  b->SetMaxSendMessageSize(kMaxMessageBytes);
  // Accept our clients' 10 s keepalive pings even when a stream is idle (a long step); gRPC's
  // default would answer them with GOAWAY "too_many_pings" and drop the link.
  b->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  b->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  b->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace longhaul
