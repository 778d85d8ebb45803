// A worker's identity (docs/security.md): its key and certificate signed by the cluster's CA, kept in
// DATA_DIR/tls (worker.key mode 0600, worker.crt, ca.crt), or got by joining with a token:
//
//   absl::StatusOr<WorkerIdentity> id = LoadOrJoin({.data_dir = d, .coordinator = addr, .name = "w0",
//                                                   .token = t, .ca_fingerprint = "sha256:..."});
//
// Joining, as kubeadm's discovery: a TLS handshake that trusts nothing finds the CA in the
// coordinator's chain by its fingerprint (security::FetchCa); then, trusting only that CA, the
// worker sends a certificate request and the token over the Join RPC. The key never leaves it.
// A stored certificate is checked against the coordinator's CA at start-up (a worker of another
// cluster is told so, rather than failing TLS handshakes without a word), and renewed (a new key,
// the same name; the coordinator's Renew over mTLS with the current certificate) when it expires
// within kRenewBefore or lacks the worker's own DNS name (issued by an older coordinator).
#ifndef LONGHAUL_WORKER_IDENTITY_H_
#define LONGHAUL_WORKER_IDENTITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/pki.h"

namespace longhaul::worker {

inline constexpr absl::Duration kRenewBefore = absl::Hours(24 * 30);

struct JoinOptions {
  std::string data_dir;
  std::string coordinator;
  std::string name;            // "" = the stored certificate's, else the host name
  std::string token;           // "" = a stored identity is required
  std::string ca_fingerprint;  // needed to join; checked against a stored CA when given
};

struct WorkerIdentity {
  std::string name;
  std::string ca_pem;
  security::KeyAndCert own;
  bool joined = false;  // got now, with the token
};

absl::StatusOr<WorkerIdentity> LoadOrJoin(const JoinOptions& o);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_IDENTITY_H_
