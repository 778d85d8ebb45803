// TLS for longhaul's gRPC services, on gRPC's own SSL credentials (no crypto of our own), and the
// checks that go with it. docs/security.md has the design.
//
//   Server (coordinator: client certificates verified when sent, the role checked per RPC; workers:
//   required):
//     b.AddListeningPort(listen, ServerCredentials(pki.server, pki.ca.cert_pem(), ClientCerts::kRequire), &port);
//   Client (the name checked is the role's fixed DNS name, not the address dialled):
//     auto ch = SecureChannel(addr, ChannelCredentials(ca_pem, &own), kCoordinatorServerName, LonghaulChannelArgs());
//   In a handler:
//     std::optional<Identity> who = PeerIdentity(*ctx->auth_context());   // nullopt: no certificate
//
// A server sends its CA's certificate after its own, so that a worker holding only the CA's
// fingerprint can find the CA in the handshake (FetchCa, as kubeadm's discovery hash).
//
// The data plane (StageLink, CheckpointStore, Collective channels between workers) takes its
// credentials from one process-wide setting (SetDataPlaneIdentity), made once by the worker at
// start-up before any channel exists: the senders live in modules that know nothing of identities.
#ifndef LONGHAUL_SECURITY_TLS_H_
#define LONGHAUL_SECURITY_TLS_H_

#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/pki.h"

namespace longhaul::security {

enum class ClientCerts {
  kOptional,  // verified when sent (the coordinator: Join comes without one; RPCs check roles)
  kRequire,   // the handshake fails without a certificate of this CA (workers' servers)
};
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const KeyAndCert& own, const std::string& ca_pem,
                                                           ClientCerts client_certs);
// Verifies the server against `ca_pem`; presents `own` when given.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& ca_pem, const KeyAndCert* own);
// A channel that checks the server certificate's DNS name `server_name` (kCoordinatorServerName,
// kWorkerServerName) instead of the address's host.
std::shared_ptr<grpc::Channel> SecureChannel(const std::string& target,
                                             const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                             const std::string& server_name, grpc::ChannelArguments args);

// The identity in the peer's verified certificate; nullopt when it sent none (or on plaintext).
std::optional<Identity> PeerIdentity(const grpc::AuthContext& ctx);

// For --insecure: OK when `listen` (HOST:PORT) only accepts connections from this machine, else
// an error saying why plaintext is refused there.
absl::Status CheckLoopbackListen(const std::string& flag, const std::string& listen);
// Whether `target` (HOST:PORT) is on this machine (plaintext clients are refused elsewhere).
bool IsLoopbackTarget(const std::string& target);

// Connects to `target` with a TLS handshake that trusts nothing, and returns the certificate in
// the server's chain whose fingerprint is `fingerprint` (NormalizeFingerprint form), having
// checked that it signed the server's certificate. Errors name what the server sent instead.
absl::StatusOr<std::string> FetchCa(const std::string& target, const std::string& fingerprint,
                                    absl::Duration timeout = absl::Seconds(10));

// The data plane's process-wide identity (see the top of this file). Not set: plaintext.
void SetDataPlaneIdentity(const std::string& ca_pem, const KeyAndCert& own);
bool DataPlaneTls();
// A channel to another worker's server: mTLS with the data-plane identity when set, else plaintext.
// With `peer_name` (the worker the caller means to reach) the handshake also checks that the server
// is that worker (WorkerServerName), so frames never go to another worker of the cluster that took
// over the address; without it, any worker of the cluster.
std::shared_ptr<grpc::Channel> DataPlaneChannel(const std::string& target, grpc::ChannelArguments args,
                                                const std::string& peer_name = "");
// The worker server's credentials: mTLS (client certificates required) when set, else plaintext.
std::shared_ptr<grpc::ServerCredentials> DataPlaneServerCredentials();

}  // namespace longhaul::security

#endif  // LONGHAUL_SECURITY_TLS_H_
