#include "security/tls.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpc/grpc_security_constants.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "absl/base/call_once.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace longhaul::security {
namespace {

// Splits HOST:PORT ("[v6]:port" too); the host without brackets.
bool SplitHostPort(const std::string& hp, std::string* host, std::string* port) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos) return false;
  *host = hp.substr(0, colon);
  *port = hp.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return true;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// Workers' servers serve other workers only: a certificate of another role (admin, read-only) is
// refused on every method, before any handler runs.
class WorkersOnly final : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* ctx, OutputMetadata*, OutputMetadata*) override {
    std::optional<Identity> who = PeerIdentity(*ctx);
    if (who && who->role == Role::kWorker) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        who ? absl::StrCat("certificate of ", who->name, " has role ", RoleName(who->role),
                                           "; a worker's data plane takes workers only")
                            : "no client certificate");
  }
};

struct DataPlane {
  absl::Mutex mu;
  bool set = false;
  std::string ca_pem;
  KeyAndCert own;
};
DataPlane& GetDataPlane() {
  static DataPlane* d = new DataPlane;
  return *d;
}

std::string CertPem(X509* c) {
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(b, c);
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  std::string s(data, static_cast<size_t>(n));
  BIO_free(b);
  return s;
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const KeyAndCert& own, const std::string& ca_pem,
                                                           ClientCerts client_certs) {
  grpc::SslServerCredentialsOptions o(client_certs == ClientCerts::kRequire
                                          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                          : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ca_pem;
  // The CA after the server's own certificate: what FetchCa finds by its fingerprint.
  o.pem_key_cert_pairs.push_back({own.key_pem, absl::StrCat(own.cert_pem, ca_pem)});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& ca_pem, const KeyAndCert* own) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_pem;
  if (own != nullptr) {
    o.pem_private_key = own->key_pem;
    o.pem_cert_chain = own->cert_pem;
  }
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::Channel> SecureChannel(const std::string& target,
                                             const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                             const std::string& server_name, grpc::ChannelArguments args) {
  args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(target, creds, args);
}

std::optional<Identity> PeerIdentity(const grpc::AuthContext& ctx) {
  if (!ctx.IsPeerAuthenticated()) return std::nullopt;
  std::vector<grpc::string_ref> pem = ctx.FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return std::nullopt;
  absl::StatusOr<Identity> who = CertificateIdentity(std::string(pem[0].data(), pem[0].size()));
  if (!who.ok()) return std::nullopt;
  return *who;
}

absl::Status CheckLoopbackListen(const std::string& flag, const std::string& listen) {
  std::string host, port;
  if (SplitHostPort(listen, &host, &port) && IsLoopbackHost(host)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--insecure: plaintext only on loopback, but ", flag, " is ", listen,
                   " (other machines could reach it). Listen on 127.0.0.1 or drop --insecure (TLS; docs/security.md)"));
}

bool IsLoopbackTarget(const std::string& target) {
  std::string t = target;
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(t, scheme)) t = t.substr(std::strlen(scheme));
  }
  std::string host, port;
  return SplitHostPort(t, &host, &port) && IsLoopbackHost(host);
}

absl::StatusOr<std::string> FetchCa(const std::string& target, const std::string& fingerprint, absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(target, &host, &port)) return absl::InvalidArgumentError(absl::StrCat("not HOST:PORT: ", target));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat(target, ": ", gai_strerror(rc)));
  }
  // Every address the name has, in order ("localhost" may give ::1 before 127.0.0.1).
  int fd = -1;
  std::string why = "no address";
  const timeval tv = absl::ToTimeval(timeout);
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to the coordinator at ", target, ": ", why));
  SSL_CTX* sctx = SSL_CTX_new(TLS_client_method());
  if (sctx == nullptr) {
    close(fd);
    return absl::InternalError("SSL_CTX_new failed");
  }
  SSL_CTX_set_verify(sctx, SSL_VERIFY_NONE, nullptr);  // trusted below, by the fingerprint only
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(sctx, kAlpn, sizeof(kAlpn));
  SSL* ssl = SSL_new(sctx);
  SSL_set_fd(ssl, fd);
  absl::StatusOr<std::string> result = absl::UnavailableError("no handshake");
  if (SSL_connect(ssl) != 1) {
    result = absl::UnavailableError(absl::StrCat("no TLS handshake with the coordinator at ", target,
                                                 " (is it running with --insecure?)"));
  } else {
    STACK_OF(X509)* chain = SSL_get_peer_cert_chain(ssl);  // the server's own certificate first
    X509* leaf = chain != nullptr && sk_X509_num(chain) > 0 ? sk_X509_value(chain, 0) : nullptr;
    std::string seen;
    result = absl::PermissionDeniedError("");
    for (int i = 1; chain != nullptr && i < sk_X509_num(chain); ++i) {  // [0] is the server's own
      X509* c = sk_X509_value(chain, i);
      const std::string pem = CertPem(c);
      absl::StatusOr<std::string> fp = Fingerprint(pem);
      if (!fp.ok()) continue;
      if (*fp != fingerprint) {
        absl::StrAppend(&seen, seen.empty() ? "" : ", ", *fp);
        continue;
      }
      EVP_PKEY* pub = X509_get0_pubkey(c);
      if (leaf != nullptr && pub != nullptr && X509_verify(leaf, pub) == 1) {
        result = pem;
      } else {
        result = absl::PermissionDeniedError(absl::StrCat(
            "the coordinator at ", target, " sent the CA ", fingerprint, " but its own certificate is not signed by it"));
      }
      break;
    }
    if (result.status().ok() == false && result.status().message().empty()) {
      result = absl::PermissionDeniedError(
          absl::StrCat("the coordinator at ", target, " is not the one expected: its CA fingerprint is ",
                       seen.empty() ? "(none sent)" : seen, ", --ca-fingerprint is ", fingerprint));
    }
  }
  ERR_clear_error();
  SSL_free(ssl);
  SSL_CTX_free(sctx);
  close(fd);
  return result;
}

void SetDataPlaneIdentity(const std::string& ca_pem, const KeyAndCert& own) {
  DataPlane& d = GetDataPlane();
  absl::MutexLock l(&d.mu);
  d.set = true;
  d.ca_pem = ca_pem;
  d.own = own;
}

bool DataPlaneTls() {
  DataPlane& d = GetDataPlane();
  absl::MutexLock l(&d.mu);
  return d.set;
}

std::shared_ptr<grpc::Channel> DataPlaneChannel(const std::string& target, grpc::ChannelArguments args,
                                                const std::string& peer_name) {
  DataPlane& d = GetDataPlane();
  absl::MutexLock l(&d.mu);
  if (!d.set) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  return SecureChannel(target, ChannelCredentials(d.ca_pem, &d.own),
                       peer_name.empty() ? std::string(kWorkerServerName) : WorkerServerName(peer_name), args);
}

std::shared_ptr<grpc::ServerCredentials> DataPlaneServerCredentials() {
  DataPlane& d = GetDataPlane();
  absl::MutexLock l(&d.mu);
  if (!d.set) return grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::ServerCredentials> creds = ServerCredentials(d.own, d.ca_pem, ClientCerts::kRequire);
  creds->SetAuthMetadataProcessor(std::make_shared<WorkersOnly>());
  return creds;
}

}  // namespace longhaul::security
