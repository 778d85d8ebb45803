#include "worker/identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
    // Senders check a worker's own DNS name (security::WorkerServerName); certificates of coordinators
    // before it carry only the shared one.
    if (!security::CertificateHasDnsName(id->own.cert_pem, security::WorkerServerName(id->name))) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, "/worker.crt lacks this worker's own DNS name (", security::WorkerServerName(id->name),
          "): it was issued by an older coordinator. Remove ", dir,
          " and join again with a token, under a new --name (the CA certifies a name once)"));
    }
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
  absl::StatusOr<security::Identity> who = security::CertificateIdentity(resp.certificate_pem());
  if (!who.ok() || who->name != id.name || who->role != security::Role::kWorker) {
    return absl::PermissionDeniedError(
        absl::StrCat("the coordinator signed no worker certificate for ", id.name, " (token of role ", resp.role(), ")"));
  }
  id.ca_pem = *ca;
  id.own = {*key, resp.certificate_pem()};
  id.joined = true;
  std::error_code ec;
  std::filesystem::create_directories(o.data_dir, ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  for (auto [file, text, mode] : {std::tuple{"ca.crt", &id.ca_pem, 0644u}, std::tuple{"worker.key", &id.own.key_pem, 0600u},
                                  std::tuple{"worker.crt", &id.own.cert_pem, 0644u}}) {
    if (absl::Status w = security::WriteFileAtomic(absl::StrCat(dir, "/", file), *text, mode); !w.ok()) return w;
  }
  return id;
}

}  // namespace longhaul::worker
