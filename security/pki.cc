#include "security/pki.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/read_file.h"

namespace longhaul::security {
namespace {

// OpenSSL objects with their free functions.
struct PkeyFree { void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); } };
struct X509Free { void operator()(X509* p) const { X509_free(p); } };
struct ReqFree { void operator()(X509_REQ* p) const { X509_REQ_free(p); } };
struct BioFree { void operator()(BIO* p) const { BIO_free(p); } };
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Req = std::unique_ptr<X509_REQ, ReqFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

// The reason of OpenSSL's latest error, after `what`.
absl::Status SslError(const std::string& what) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  char buf[256] = {0};
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  return absl::InvalidArgumentError(e != 0 ? absl::StrCat(what, ": ", buf) : what);
}

Bio MemBio(const std::string& s) { return Bio(BIO_new_mem_buf(s.data(), static_cast<int>(s.size()))); }

std::string BioString(BIO* b) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<Pkey> ParseKey(const std::string& pem) {
  Bio b = MemBio(pem);
  Pkey k(PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr));
  if (!k) return SslError("not a PEM private key");
  return k;
}

absl::StatusOr<Cert> ParseCert(const std::string& pem) {
  Bio b = MemBio(pem);
  Cert c(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr));
  if (!c) return SslError("not a PEM certificate");
  return c;
}

std::string CertPem(X509* c) {
  Bio b(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(b.get(), c);
  return BioString(b.get());
}

std::string KeyPem(EVP_PKEY* k) {
  Bio b(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(b.get(), k, nullptr, nullptr, 0, nullptr, nullptr);
  return BioString(b.get());
}

absl::Status SetSubject(X509_NAME* n, const Identity& who) {
  const std::string role = RoleName(who.role);
  if (!X509_NAME_add_entry_by_txt(n, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("longhaul"), -1, -1, 0) ||
      !X509_NAME_add_entry_by_txt(n, "OU", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(role.c_str()), -1, -1, 0) ||
      !X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(who.name.c_str()), -1, -1,
                                  0)) {
    return SslError("cannot set the certificate subject");
  }
  return absl::OkStatus();
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return SslError(absl::StrCat("cannot make extension ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok ? absl::OkStatus() : SslError("cannot add an extension");
}

// A certificate for `pub` signed by `signer` (self-signed when issuer is null).
absl::StatusOr<Cert> MakeCert(EVP_PKEY* pub, const Identity& who, absl::Duration validity, X509* issuer,
                              EVP_PKEY* signer, bool is_ca, const std::vector<std::string>& dns_names) {
  Cert c(X509_new());
  if (!c) return SslError("X509_new");
  X509_set_version(c.get(), 2);  // v3
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return SslError("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(c.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);  // an hour of clock skew between machines
  X509_gmtime_adj(X509_getm_notAfter(c.get()), static_cast<long>(absl::ToInt64Seconds(validity)));
  if (!X509_set_pubkey(c.get(), pub)) return SslError("X509_set_pubkey");
  if (absl::Status s = SetSubject(X509_get_subject_name(c.get()), who); !s.ok()) return s;
  X509* iss = issuer != nullptr ? issuer : c.get();
  if (!X509_set_issuer_name(c.get(), X509_get_subject_name(iss))) return SslError("X509_set_issuer_name");
  std::vector<std::pair<int, std::string>> exts;
  if (is_ca) {
    exts = {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
            {NID_key_usage, "critical,keyCertSign,cRLSign"},
            {NID_subject_key_identifier, "hash"}};
  } else {
    exts = {{NID_basic_constraints, "critical,CA:FALSE"},
            {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
            // Server names (a server certificate) or a client's only: a read-only or admin
            // certificate cannot serve.
            {NID_ext_key_usage, dns_names.empty() ? "clientAuth" : "serverAuth,clientAuth"},
            {NID_subject_key_identifier, "hash"},
            {NID_authority_key_identifier, "keyid"}};
    if (!dns_names.empty()) {
      std::vector<std::string> sans;
      for (const std::string& d : dns_names) sans.push_back(absl::StrCat("DNS:", d));
      exts.emplace_back(NID_subject_alt_name, absl::StrJoin(sans, ","));
    }
  }
  for (const auto& [nid, value] : exts) {
    if (absl::Status s = AddExt(c.get(), iss, nid, value); !s.ok()) return s;
  }
  if (X509_sign(c.get(), signer, EVP_sha256()) == 0) return SslError("cannot sign the certificate");
  return c;
}

absl::StatusOr<Pkey> NewKey() {
  Pkey k(EVP_EC_gen("P-256"));
  if (!k) return SslError("cannot generate an EC P-256 key");
  return k;
}

}  // namespace

std::string RoleName(Role r) {
  switch (r) {
    case Role::kWorker: return "worker";
    case Role::kAdmin: return "admin";
    case Role::kReadOnly: return "read-only";
    case Role::kCoordinator: return "coordinator";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kWorker, Role::kAdmin, Role::kReadOnly, Role::kCoordinator}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown role \"", name, "\" (worker, admin or read-only)"));
}

absl::Status CheckIdentityName(absl::string_view name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char ch : name) ok = ok && (absl::ascii_isalnum(ch) || ch == '.' || ch == '_' || ch == '-');
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", name, "\" cannot be a certificate's name (1..64 of letters, digits, '.', '_', '-')"));
  }
  // A certificate without a DNS name is matched by its CN where a client checks a server's name:
  // the servers' names (and anything under .longhaul) are the CA's own to give.
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "longhaul" || absl::EndsWith(lower, ".longhaul")) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" cannot be a certificate's name (names ending in "
                                                   "\".longhaul\" are reserved for the cluster's servers)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewPrivateKey() {
  absl::StatusOr<Pkey> k = NewKey();
  if (!k.ok()) return k.status();
  return KeyPem(k->get());
}

absl::StatusOr<std::string> MakeCsr(const std::string& key_pem, const std::string& name) {
  if (absl::Status s = CheckIdentityName(name); !s.ok()) return s;
  absl::StatusOr<Pkey> k = ParseKey(key_pem);
  if (!k.ok()) return k.status();
  Req r(X509_REQ_new());
  X509_NAME* n = X509_REQ_get_subject_name(r.get());
  if (!X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0) ||
      !X509_REQ_set_pubkey(r.get(), k->get()) || X509_REQ_sign(r.get(), k->get(), EVP_sha256()) == 0) {
    return SslError("cannot make the certificate request");
  }
  Bio b(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509_REQ(b.get(), r.get());
  return BioString(b.get());
}

absl::StatusOr<Identity> CertificateIdentity(const std::string& cert_pem) {
  absl::StatusOr<Cert> c = ParseCert(cert_pem);
  if (!c.ok()) return c.status();
  X509_NAME* n = X509_get_subject_name(c->get());
  auto field = [n](int nid) -> std::string {
    const int i = X509_NAME_get_index_by_NID(n, nid, -1);
    if (i < 0) return "";
    ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(n, i));
    return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), ASN1_STRING_length(s));
  };
  Identity who;
  who.name = field(NID_commonName);
  absl::StatusOr<Role> role = ParseRole(field(NID_organizationalUnitName));
  if (who.name.empty() || !role.ok()) {
    return absl::InvalidArgumentError("the certificate is not a longhaul identity (no CN name or OU role)");
  }
  who.role = *role;
  return who;
}

absl::StatusOr<std::string> Fingerprint(const std::string& cert_pem) {
  absl::StatusOr<Cert> c = ParseCert(cert_pem);
  if (!c.ok()) return c.status();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!X509_digest(c->get(), EVP_sha256(), md, &n)) return SslError("X509_digest");
  return absl::StrCat("sha256:", absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(md), n)));
}

std::string WorkerServerName(absl::string_view worker_name) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(worker_name.data()), worker_name.size(), md);
  return absl::StrCat(absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(md), 16)), ".",
                      kWorkerServerName);
}

std::vector<std::string> WorkerDnsNames(absl::string_view worker_name) {
  return {kWorkerServerName, WorkerServerName(worker_name)};
}

bool CertificateHasDnsName(const std::string& cert_pem, absl::string_view dns_name) {
  absl::StatusOr<Cert> c = ParseCert(cert_pem);
  return c.ok() && X509_check_host(c->get(), dns_name.data(), dns_name.size(),
                                   X509_CHECK_FLAG_NO_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT, nullptr) == 1;
}

absl::StatusOr<absl::Time> CertificateExpiry(const std::string& cert_pem) {
  absl::StatusOr<Cert> c = ParseCert(cert_pem);
  if (!c.ok()) return c.status();
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(c->get()), &tm) != 1) return SslError("ASN1_TIME_to_tm");
  return absl::FromTM(tm, absl::UTCTimeZone());
}

absl::StatusOr<std::string> NormalizeFingerprint(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (absl::StartsWith(t, "sha256:")) t = t.substr(7);
  std::string hex;
  bool bad = false;
  for (char ch : t) {
    if (ch == ':') continue;
    bad = bad || !absl::ascii_isxdigit(ch);
    hex.push_back(ch);
  }
  if (hex.size() != 64 || bad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not a CA fingerprint (sha256: and 64 hex digits, as the coordinator prints at start-up)"));
  }
  return absl::StrCat("sha256:", hex);
}

absl::StatusOr<CertificateAuthority> CertificateAuthority::Create(const std::string& name) {
  absl::StatusOr<Pkey> k = NewKey();
  if (!k.ok()) return k.status();
  absl::StatusOr<Cert> c =
      MakeCert(k->get(), {name, Role::kCoordinator}, absl::Hours(24 * 3650), nullptr, k->get(), true, {});
  if (!c.ok()) return c.status();
  return Load({KeyPem(k->get()), CertPem(c->get())});
}

absl::StatusOr<CertificateAuthority> CertificateAuthority::Load(const KeyAndCert& pem) {
  absl::StatusOr<Pkey> k = ParseKey(pem.key_pem);
  if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("CA key: ", k.status().message()));
  absl::StatusOr<Cert> c = ParseCert(pem.cert_pem);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("CA certificate: ", c.status().message()));
  if (X509_check_private_key(c->get(), k->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the CA key does not belong to the CA certificate");
  }
  CertificateAuthority ca;
  ca.pem_ = pem;
  absl::StatusOr<std::string> fp = Fingerprint(pem.cert_pem);
  if (!fp.ok()) return fp.status();
  ca.fingerprint_ = *fp;
  return ca;
}

namespace {

// A PEM certificate request whose signature verifies with its own key (proof that the requester
// holds the key).
absl::StatusOr<Req> ParseCsr(const std::string& csr_pem) {
  Bio b = MemBio(csr_pem);
  Req r(PEM_read_bio_X509_REQ(b.get(), nullptr, nullptr, nullptr));
  if (!r) return SslError("not a PEM certificate request");
  EVP_PKEY* pub = X509_REQ_get0_pubkey(r.get());
  if (pub == nullptr || X509_REQ_verify(r.get(), pub) != 1) {
    return SslError("the certificate request's signature does not verify");
  }
  return r;
}

// Whether the certificate is of the key (its public key is the key's).
bool KeyMatches(const KeyAndCert& kc) {
  absl::StatusOr<Pkey> k = ParseKey(kc.key_pem);
  absl::StatusOr<Cert> c = ParseCert(kc.cert_pem);
  const bool ok = k.ok() && c.ok() && X509_check_private_key(c->get(), k->get()) == 1;
  ERR_clear_error();
  return ok;
}

}  // namespace

absl::Status CheckCsr(const std::string& csr_pem) { return ParseCsr(csr_pem).status(); }

absl::StatusOr<std::string> CertificateAuthority::Sign(const std::string& csr_pem, const Identity& who,
                                                       absl::Duration validity,
                                                       const std::vector<std::string>& dns_names) const {
  if (absl::Status s = CheckIdentityName(who.name); !s.ok()) return s;
  absl::StatusOr<Req> r = ParseCsr(csr_pem);
  if (!r.ok()) return r.status();
  EVP_PKEY* pub = X509_REQ_get0_pubkey(r->get());
  absl::StatusOr<Pkey> k = ParseKey(pem_.key_pem);
  absl::StatusOr<Cert> ca = ParseCert(pem_.cert_pem);
  if (!k.ok() || !ca.ok()) return absl::InternalError("the CA does not load");
  absl::StatusOr<Cert> c = MakeCert(pub, who, validity, ca->get(), k->get(), false, dns_names);
  if (!c.ok()) return c.status();
  return CertPem(c->get());
}

absl::StatusOr<KeyAndCert> CertificateAuthority::Issue(const Identity& who, absl::Duration validity,
                                                       const std::vector<std::string>& dns_names) const {
  absl::StatusOr<std::string> key = NewPrivateKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = MakeCsr(*key, who.name);
  if (!csr.ok()) return csr.status();
  absl::StatusOr<std::string> cert = Sign(*csr, who, validity, dns_names);
  if (!cert.ok()) return cert.status();
  return KeyAndCert{*key, *cert};
}

absl::Status CertificateAuthority::Verify(const std::string& cert_pem) const {
  absl::StatusOr<Cert> c = ParseCert(cert_pem);
  if (!c.ok()) return c.status();
  absl::StatusOr<Cert> ca = ParseCert(pem_.cert_pem);
  if (!ca.ok()) return ca.status();
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca->get());
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, c->get(), nullptr);
  const int ok = X509_verify_cert(ctx);
  const int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  ERR_clear_error();
  if (ok == 1) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("certificate not valid for CA ", fingerprint_, ": ", X509_verify_cert_error_string(err)));
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& content, unsigned mode) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", why));
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);  // not narrowed by the umask
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterPki> OpenClusterPki(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  ClusterPki pki;
  auto read_pair = [&](const std::string& base) -> absl::StatusOr<KeyAndCert> {
    absl::StatusOr<std::string> key = common::ReadFile(absl::StrCat(dir, "/", base, ".key"));
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> cert = common::ReadFile(absl::StrCat(dir, "/", base, ".crt"));
    if (!cert.ok()) return cert.status();
    return KeyAndCert{*key, *cert};
  };
  auto write_pair = [&](const std::string& base, const KeyAndCert& kc) -> absl::Status {
    // The certificate first: a crash between the two leaves no key without its certificate.
    if (absl::Status s = WriteFileAtomic(absl::StrCat(dir, "/", base, ".crt"), kc.cert_pem, 0644); !s.ok()) return s;
    return WriteFileAtomic(absl::StrCat(dir, "/", base, ".key"), kc.key_pem, 0600);
  };
  const bool exists = ::access(absl::StrCat(dir, "/ca.key").c_str(), F_OK) == 0;
  if (exists) {
    absl::StatusOr<KeyAndCert> ca = read_pair("ca");
    if (!ca.ok()) return ca.status();
    absl::StatusOr<CertificateAuthority> loaded = CertificateAuthority::Load(*ca);
    if (!loaded.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", loaded.status().message()));
    pki.ca = *std::move(loaded);
  } else {
    absl::StatusOr<CertificateAuthority> made = CertificateAuthority::Create("longhaul cluster CA");
    if (!made.ok()) return made.status();
    pki.ca = *std::move(made);
    if (absl::Status s = write_pair("ca", pki.ca.pem()); !s.ok()) return s;
    pki.created = true;
  }
  // The coordinator's and the admin's certificates: made when missing (or signed by another CA).
  struct Want {
    const char* base;
    Identity who;
    std::vector<std::string> dns;
    KeyAndCert* out;
  };
  for (const Want& w : {Want{"coordinator", {"coordinator", Role::kCoordinator}, {kCoordinatorServerName}, &pki.server},
                        Want{"admin", {"admin", Role::kAdmin}, {}, &pki.admin}}) {
    absl::StatusOr<KeyAndCert> have = read_pair(w.base);
    // Re-issued when missing, of another CA, or not of its key (a crash between the two writes).
    if (have.ok() && pki.ca.Verify(have->cert_pem).ok() && KeyMatches(*have)) {
      *w.out = *have;
      continue;
    }
    absl::StatusOr<KeyAndCert> made = pki.ca.Issue(w.who, absl::Hours(24 * 3650), w.dns);
    if (!made.ok()) return made.status();
    if (absl::Status s = write_pair(w.base, *made); !s.ok()) return s;
    *w.out = *made;
  }
  return pki;
}

std::string NewToken() {
  unsigned char b[32];
  if (RAND_bytes(b, sizeof(b)) != 1) std::abort();  // no randomness: nothing secure can be made
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(b), sizeof(b)));
}

std::string TokenHash(absl::string_view token) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), md);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(md), sizeof(md)));
}

}  // namespace longhaul::security
