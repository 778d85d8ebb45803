// The cluster's public-key infrastructure, on OpenSSL (no crypto of our own): a certificate
// authority kept by the coordinator, the identities it signs (a name and a role in the
// certificate's subject), join tokens, and the files they live in. docs/security.md has the design.
//
//   absl::StatusOr<ClusterPki> pki = OpenClusterPki("/var/lib/longhaul-coordinator/pki");  // made on first use
//   std::string key = *NewPrivateKey();
//   std::string csr = *MakeCsr(key, "w0");                        // on the worker: the key stays there
//   std::string cert = *pki->ca.Sign(csr, {"w0", Role::kWorker}, absl::Hours(24 * 365));
//   Identity who = *CertificateIdentity(cert);                   // {"w0", kWorker}
//
// A certificate's identity: subject CN = name, OU = role. Server certificates also carry a DNS name
// clients check instead of the address they dial (addresses change; see tls.h): the coordinator's
// kCoordinatorServerName, every worker's kWorkerServerName and its own WorkerServerName(name) (the
// name a sender checks when it dials one particular worker). Keys are EC P-256.
//
// Thread-safe: every function; a CertificateAuthority is immutable after creation.
#ifndef LONGHAUL_SECURITY_PKI_H_
#define LONGHAUL_SECURITY_PKI_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace longhaul::security {

// What a certificate may do on the control plane (docs/security.md): a worker registers and keeps
// its session; read-only reads (jobs, workers, links, plans); admin does everything. The
// coordinator's own server certificate has kCoordinator.
enum class Role { kWorker, kAdmin, kReadOnly, kCoordinator };
std::string RoleName(Role r);  // "worker", "admin", "read-only", "coordinator"
absl::StatusOr<Role> ParseRole(absl::string_view name);

struct Identity {
  std::string name;
  Role role = Role::kWorker;
};

// The DNS names in server certificates (the clients' target-name check).
inline constexpr char kCoordinatorServerName[] = "coordinator.longhaul";
inline constexpr char kWorkerServerName[] = "worker.longhaul";
// One worker's own DNS name: the first 128 bits of SHA-256(name) in hex, then ".worker.longhaul".
// A hash rather than the name: DNS matching ignores case (names differing only in case are two
// workers) and a name need not be a valid DNS label.
std::string WorkerServerName(absl::string_view worker_name);
// The DNS names a worker's certificate carries: kWorkerServerName and WorkerServerName(name).
std::vector<std::string> WorkerDnsNames(absl::string_view worker_name);
// Whether `cert_pem` carries `dns_name` among its subject alternative names (exact match).
bool CertificateHasDnsName(const std::string& cert_pem, absl::string_view dns_name);
// When `cert_pem` stops being valid (its notAfter).
absl::StatusOr<absl::Time> CertificateExpiry(const std::string& cert_pem);

// A private key and its certificate, PEM.
struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

// A name for a certificate: 1..64 of [A-Za-z0-9._-] (worker names, admin identities).
absl::Status CheckIdentityName(absl::string_view name);

absl::StatusOr<std::string> NewPrivateKey();  // PEM (PKCS#8)
// A certificate signing request for `name`, signed by `key_pem` (proof of possession).
absl::StatusOr<std::string> MakeCsr(const std::string& key_pem, const std::string& name);
// OK when `csr_pem` is a certificate request whose signature verifies (what Sign checks first).
absl::Status CheckCsr(const std::string& csr_pem);
// The name (CN) and role (OU) in a certificate's subject.
absl::StatusOr<Identity> CertificateIdentity(const std::string& cert_pem);
// "sha256:" + hex SHA-256 of the certificate's DER form (what `--ca-fingerprint` takes).
absl::StatusOr<std::string> Fingerprint(const std::string& cert_pem);
// A fingerprint as the user typed it, normalised: optional "sha256:" prefix, colons and case ignored.
absl::StatusOr<std::string> NormalizeFingerprint(absl::string_view text);

class CertificateAuthority {
 public:
  // A new key and a self-signed CA certificate (10 years).
  static absl::StatusOr<CertificateAuthority> Create(const std::string& name);
  static absl::StatusOr<CertificateAuthority> Load(const KeyAndCert& pem);

  // A certificate for the public key in `csr_pem` (whose signature is checked), valid for
  // `validity`, with `who` as its subject (the CSR's own subject is ignored: the caller decides
  // the name and role) and `dns_names` as subject alternative names.
  absl::StatusOr<std::string> Sign(const std::string& csr_pem, const Identity& who, absl::Duration validity,
                                   const std::vector<std::string>& dns_names = {}) const;
  // A new key and its certificate (the coordinator's own identities, tests, benchmarks).
  absl::StatusOr<KeyAndCert> Issue(const Identity& who, absl::Duration validity,
                                   const std::vector<std::string>& dns_names = {}) const;
  // OK when `cert_pem` was signed by this CA and is valid now.
  absl::Status Verify(const std::string& cert_pem) const;

  const KeyAndCert& pem() const { return pem_; }
  const std::string& cert_pem() const { return pem_.cert_pem; }
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  KeyAndCert pem_;
  std::string fingerprint_;
};

// The coordinator's directory of credentials (created 0700 on first use):
//   ca.key (0600), ca.crt             the cluster CA
//   coordinator.key (0600), .crt      its TLS server certificate (kCoordinatorServerName)
//   admin.key (0600), admin.crt       the admin identity longhaulctl uses by default
struct ClusterPki {
  CertificateAuthority ca;
  KeyAndCert server;
  KeyAndCert admin;
  bool created = false;  // made by this call (first start)
};
absl::StatusOr<ClusterPki> OpenClusterPki(const std::string& dir);

// Writes `content` to `path` with `mode` from the start (a temporary file renamed into place).
absl::Status WriteFileAtomic(const std::string& path, const std::string& content, unsigned mode);

// Join tokens: 32 random bytes, hex; the coordinator keeps only their SHA-256 (TokenHash).
std::string NewToken();
std::string TokenHash(absl::string_view token);

}  // namespace longhaul::security

#endif  // LONGHAUL_SECURITY_PKI_H_
