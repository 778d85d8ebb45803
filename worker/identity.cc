#include "worker/identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/read_file.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "proto/channel_config.h"
#include "security/tls.h"

namespace longhaul::worker {
namespace {

absl::StatusOr<WorkerIdentity> Load(const std::string& dir) {
  WorkerIdentity id;
  for (auto [file, out] : {std::pair{"ca.crt", &id.ca_pem}, std::pair{"worker.crt", &id.own.cert_pem},
                           std::pair{"worker.key", &id.own.key_pem}}) {
    absl::StatusOr<std::string> text = common::ReadFile(absl::StrCat(dir, "/", file));
    if (!text.ok()) return text.status();
    *out = *text;
  }
  absl::StatusOr<security::Identity> who = security::CertificateIdentity(id.own.cert_pem);
  if (!who.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, "/worker.crt: ", who.status().message()));
  if (who->role != security::Role::kWorker) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/worker.crt has role ", security::RoleName(who->role), ", not worker"));
  }
  id.name = who->name;
  return id;
}

std::string HostName() {
  char hn[256] = {0};
  gethostname(hn, sizeof(hn) - 1);
  return hn;
}

// The certificate the coordinator sent back is a worker certificate for `name` with this worker's
// own DNS name (a coordinator of an older version issues none: senders could not reach us).
absl::Status CheckIssued(const v1::JoinResponse& resp, const std::string& name) {
  absl::StatusOr<security::Identity> who = security::CertificateIdentity(resp.certificate_pem());
  if (!who.ok() || who->name != name || who->role != security::Role::kWorker) {
    return absl::PermissionDeniedError(
        absl::StrCat("the coordinator signed no worker certificate for ", name, " (token of role ", resp.role(), ")"));
  }
  if (!security::CertificateHasDnsName(resp.certificate_pem(), security::WorkerServerName(name))) {
    return absl::FailedPreconditionError(absl::StrCat("the coordinator's certificate for ", name, " lacks its DNS name ",
                                                      security::WorkerServerName(name), " (an older coordinator?)"));
  }
  return absl::OkStatus();
}

// Writes the identity into `dir` (DATA_DIR/tls), the key mode 0600.
absl::Status Save(const std::string& data_dir, const std::string& dir, const WorkerIdentity& id) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  for (auto [file, text, mode] : {std::tuple{"ca.crt", &id.ca_pem, 0644u}, std::tuple{"worker.key", &id.own.key_pem, 0600u},
                                  std::tuple{"worker.crt", &id.own.cert_pem, 0644u}}) {
    if (absl::Status w = security::WriteFileAtomic(absl::StrCat(dir, "/", file), *text, mode); !w.ok()) return w;
  }
  return absl::OkStatus();
}

// A new key and certificate for the same name, from the coordinator's Renew over mTLS with the
// current certificate; saved in `dir`.
absl::StatusOr<WorkerIdentity> Renew(const JoinOptions& o, const std::string& dir, const WorkerIdentity& old) {
  absl::StatusOr<std::string> key = security::NewPrivateKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = security::MakeCsr(*key, old.name);
  if (!csr.ok()) return csr.status();
  auto stub = v1::Coordinator::NewStub(security::SecureChannel(o.coordinator, security::ChannelCredentials(old.ca_pem, &old.own),
                                                               security::kCoordinatorServerName, LonghaulChannelArgs()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
  v1::RenewRequest req;
  req.set_csr_pem(*csr);
  v1::JoinResponse resp;
  if (grpc::Status s = stub->Renew(&ctx, req, &resp); !s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("the coordinator at ", o.coordinator, " did not renew it: ", s.error_message()));
  }
  if (absl::Status s = CheckIssued(resp, old.name); !s.ok()) return s;
  WorkerIdentity id = old;
  id.own = {*key, resp.certificate_pem()};
  if (absl::Status s = Save(o.data_dir, dir, id); !s.ok()) return s;
  return id;
}

}  // namespace

absl::StatusOr<WorkerIdentity> LoadOrJoin(const JoinOptions& o) {
  const std::string dir = absl::StrCat(o.data_dir, "/tls");
  std::string fingerprint;
  if (!o.ca_fingerprint.empty()) {
    absl::StatusOr<std::string> fp = security::NormalizeFingerprint(o.ca_fingerprint);
    if (!fp.ok()) return absl::InvalidArgumentError(absl::StrCat("--ca-fingerprint: ", fp.status().message()));
    fingerprint = *fp;
  }
  const bool stored = ::access(absl::StrCat(dir, "/worker.crt").c_str(), F_OK) == 0;
  if (stored) {
    absl::StatusOr<WorkerIdentity> id = Load(dir);
    if (!id.ok()) return id.status();
    if (!o.name.empty() && o.name != id->name) {
      return absl::InvalidArgumentError(absl::StrCat(dir, " holds the certificate of worker ", id->name, ", not ", o.name,
                                                     " (--name); to change names, remove ", dir,
                                                     " and join again with a token"));
    }
    absl::StatusOr<std::string> own_ca = security::Fingerprint(id->ca_pem);
    if (!own_ca.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, "/ca.crt: ", own_ca.status().message()));
    if (!fingerprint.empty() && fingerprint != *own_ca) {
      return absl::PermissionDeniedError(absl::StrCat("the certificate in ", dir, " is from CA ", *own_ca,
                                                      ", not from --ca-fingerprint ", fingerprint, "; remove ", dir,
                                                      " to join this cluster"));
    }
    // Does the coordinator have our CA? (Unreachable: go on; the session retries.)
    absl::StatusOr<std::string> theirs = security::FetchCa(o.coordinator, *own_ca, absl::Seconds(5));
    if (theirs.status().code() == absl::StatusCode::kPermissionDenied) {
      return absl::PermissionDeniedError(absl::StrCat(
          "this worker's certificate (", dir, ") is from another cluster: ", theirs.status().message(),
          ". Remove ", dir, " and join with a token of this coordinator (longhaulctl token create)"));
    }
    // Renewed when it lacks this worker's own DNS name (security::WorkerServerName, which senders
    // check; an older coordinator issued it) or expires within kRenewBefore.
    const bool lacks_name = !security::CertificateHasDnsName(id->own.cert_pem, security::WorkerServerName(id->name));
    absl::StatusOr<absl::Time> expiry = security::CertificateExpiry(id->own.cert_pem);
    const bool expiring = expiry.ok() && *expiry - absl::Now() < kRenewBefore;
    if (!lacks_name && !expiring) return id;
    absl::StatusOr<WorkerIdentity> renewed = Renew(o, dir, *id);
    const std::string why = lacks_name ? absl::StrCat("lacks this worker's own DNS name ", security::WorkerServerName(id->name))
                                       : absl::StrCat("expires ", absl::FormatTime("%Y-%m-%d %H:%M UTC", *expiry, absl::UTCTimeZone()));
    if (renewed.ok()) {
      common::Log(absl::StrCat("worker ", id->name), absl::StrCat("renewed its certificate (the old one ", why, ")"));
      return renewed;
    }
    if (lacks_name) {
      return absl::FailedPreconditionError(absl::StrCat(dir, "/worker.crt ", why, " and could not be renewed: ",
                                                        renewed.status().message()));
    }
    common::LogWarning(absl::StrCat("worker ", id->name), absl::StrCat("its certificate ", why, "; renewal failed (",
                                                                       renewed.status().message(), "), tried again at the next start"));
    return id;
  }
  if (o.token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "no identity: ", dir, " holds no certificate. Join the cluster with --join-token=TOKEN --ca-fingerprint=FP ",
        "(longhaulctl token create prints both), or run with --insecure on loopback"));
  }
  if (fingerprint.empty()) {
    return absl::InvalidArgumentError(
        "--join-token needs --ca-fingerprint (the coordinator prints it at start-up; so does longhaulctl token create)");
  }
  WorkerIdentity id;
  id.name = o.name.empty() ? HostName() : o.name;
  if (absl::Status s = security::CheckIdentityName(id.name); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--name: ", s.message()));
  }
  absl::StatusOr<std::string> ca = security::FetchCa(o.coordinator, fingerprint);
  if (!ca.ok()) return absl::Status(ca.status().code(), absl::StrCat("join refused: ", ca.status().message()));
  absl::StatusOr<std::string> key = security::NewPrivateKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = security::MakeCsr(*key, id.name);
  if (!csr.ok()) return csr.status();
  // TLS trusting only the CA just found; no client certificate yet.
  auto stub = v1::Coordinator::NewStub(security::SecureChannel(o.coordinator, security::ChannelCredentials(*ca, nullptr),
                                                               security::kCoordinatorServerName, LonghaulChannelArgs()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
  v1::JoinRequest req;
  req.set_token(o.token);
  req.set_name(id.name);
  req.set_csr_pem(*csr);
  v1::JoinResponse resp;
  grpc::Status s = stub->Join(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("join refused by the coordinator at ", o.coordinator, ": ",
                                                    s.error_message()));
  }
  if (absl::Status c = CheckIssued(resp, id.name); !c.ok()) return c;
  id.ca_pem = *ca;
  id.own = {*key, resp.certificate_pem()};
  id.joined = true;
  if (absl::Status w = Save(o.data_dir, dir, id); !w.ok()) return w;
  return id;
}

}  // namespace longhaul::worker
