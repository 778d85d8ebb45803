// The coordinator's side of identity (docs/security.md): who may make which RPC, join tokens, and
// the certificates the cluster CA signs for joining workers and for longhaulctl identities.
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "security/tls.h"

namespace longhaul::coordinator {
namespace {

void Log(const std::string& msg) { common::Log("coordinator", msg); }

const char* AccessName(int need) {
  switch (need) {
    case 0: return "worker (or admin)";
    case 1: return "read-only (or admin)";
    default: return "admin";
  }
}

constexpr absl::Duration kCertificateValidity = absl::Hours(24 * 365);

// Signs `csr_pem` for `who` (a worker's certificate also carries its own DNS names) into `resp`,
// with the CA's certificate: what Join and Renew answer.
absl::Status Issue(const security::CertificateAuthority& ca, const std::string& csr_pem, const security::Identity& who,
                   v1::JoinResponse* resp) {
  std::vector<std::string> dns;
  if (who.role == security::Role::kWorker) dns = security::WorkerDnsNames(who.name);
  absl::StatusOr<std::string> cert = ca.Sign(csr_pem, who, kCertificateValidity, dns);
  if (!cert.ok()) return cert.status();
  resp->set_certificate_pem(*cert);
  resp->set_ca_pem(ca.cert_pem());
  resp->set_role(security::RoleName(who.role));
  return absl::OkStatus();
}

}  // namespace

grpc::Status CoordinatorService::Authorize(grpc::ServerContext* ctx, Access need, security::Identity* who,
                                           const char* rpc) {
  *who = {};
  if (opt_.ca == nullptr) {  // --insecure (loopback only): no identities, every caller may do everything
    who->role = security::Role::kAdmin;
    return grpc::Status::OK;
  }
  std::optional<security::Identity> peer = security::PeerIdentity(*ctx->auth_context());
  if (!peer) {
    refusals_.Warn(absl::StrCat(rpc, " ", common::GrpcPeerHost(ctx->peer())),
                   absl::StrCat(rpc, " from ", ctx->peer(), " refused: no client certificate"));
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(rpc, " needs a client certificate of this cluster (role ",
                                     AccessName(static_cast<int>(need)),
                                     "): longhaulctl takes --cert/--key/--ca, a worker joins with --join-token"));
  }
  const security::Role r = peer->role;
  const bool ok = r == security::Role::kAdmin || (need == Access::kWorker && r == security::Role::kWorker) ||
                  (need == Access::kRead && r == security::Role::kReadOnly);
  if (!ok) {
    refusals_.Warn(absl::StrCat(rpc, " ", common::GrpcPeerHost(ctx->peer())),
                   absl::StrCat(rpc, " from ", ctx->peer(), " refused: certificate ", peer->name, " has role ",
                                security::RoleName(r)));
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(rpc, " needs role ", AccessName(static_cast<int>(need)), "; the certificate of ",
                                     peer->name, " has role ", security::RoleName(r)));
  }
  *who = *peer;
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Renew(grpc::ServerContext* ctx, const v1::RenewRequest* req,
                                       v1::JoinResponse* resp) {
  if (opt_.ca == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this coordinator runs with --insecure: no identities");
  }
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kWorker, &who, "Renew"); !s.ok()) return s;
  if (who.role != security::Role::kWorker) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("Renew issues worker certificates; ", who.name, " has role ",
                                     security::RoleName(who.role)));
  }
  // Signing costs the CA a little: bounded per host as joins are.
  if (absl::Status q = join_limiter_.Take(ctx->peer()); !q.ok()) return ToGrpc(q);
  if (absl::Status s = security::CheckCsr(req->csr_pem()); !s.ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
  }
  if (absl::Status s = Issue(*opt_.ca, req->csr_pem(), who, resp); !s.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
  }
  Log(absl::StrCat("renewed the certificate of worker ", who.name, " (", ctx->peer(), ")"));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Join(grpc::ServerContext* ctx, const v1::JoinRequest* req, v1::JoinResponse* resp) {
  if (opt_.ca == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this coordinator runs with --insecure (no CA): start the worker with --insecure too");
  }
  // Anyone who can connect may call Join: its cost is bounded per client host before anything else.
  if (absl::Status q = join_limiter_.Take(ctx->peer()); !q.ok()) return ToGrpc(q);
  auto refuse = [&](grpc::StatusCode code, absl::string_view why) {
    // One line each (joins are rate-limited per host, so these are too): the reasons differ.
    Log(absl::StrCat("join of ", req->name(), " from ", ctx->peer(), " refused: ", why));
    return grpc::Status(code, std::string(why));
  };
  if (absl::Status s = security::CheckIdentityName(req->name()); !s.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, s.message());
  }
  // The request first: a malformed one does not spend a use of the token.
  if (absl::Status s = security::CheckCsr(req->csr_pem()); !s.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, s.message());
  }
  absl::StatusOr<std::string> role_name;
  {
    // The checks and the writes in one transaction: two joins cannot share the last use of a
    // token, nor both get the same name.
    absl::MutexLock l(&mu_);
    if (absl::Status s = store_->Begin(); !s.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
    absl::StatusOr<std::optional<Store::Issued>> issued = store_->FindIssued(req->name());
    if (!issued.ok()) {
      role_name = issued.status();
    } else if (issued->has_value()) {
      // Its holder would pass as that worker (sessions and data-plane streams go by the name).
      role_name = absl::AlreadyExistsError(absl::StrCat(
          "the name ", req->name(), " was given a certificate already (role ", (*issued)->role, ", ",
          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(static_cast<int64_t>((*issued)->issued_unix)),
                           absl::UTCTimeZone()),
          "); a worker that lost its data directory joins under a new --name"));
    } else {
      role_name = store_->UseToken(security::TokenHash(req->token()), UnixNow());
      if (role_name.ok()) {
        if (absl::Status s = store_->PutIssued(req->name(), *role_name, UnixNow()); !s.ok()) role_name = s;
      }
    }
    if (absl::Status s = store_->Commit(); !s.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
  }
  if (!role_name.ok()) {
    return refuse(role_name.status().code() == absl::StatusCode::kAlreadyExists ? grpc::StatusCode::ALREADY_EXISTS
                                                                                : grpc::StatusCode::PERMISSION_DENIED,
                  role_name.status().message());
  }
  absl::StatusOr<security::Role> role = security::ParseRole(*role_name);
  if (!role.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(role.status().message()));
  if (absl::Status s = Issue(*opt_.ca, req->csr_pem(), {req->name(), *role}, resp); !s.ok()) {
    return refuse(grpc::StatusCode::INTERNAL, s.message());
  }
  Log(absl::StrCat("joined: ", req->name(), " (role ", *role_name, ") from ", ctx->peer()));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CreateToken(grpc::ServerContext* ctx, const v1::CreateTokenRequest* req,
                                             v1::CreateTokenResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kAdmin, &who, "CreateToken"); !s.ok()) return s;
  if (opt_.ca == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this coordinator runs with --insecure: no join tokens");
  }
  const std::string role = req->role().empty() ? "worker" : req->role();
  if (role != "worker" && role != "read-only") {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a join token's role is worker or read-only, not \"", role,
                                     "\" (longhaulctl identity create makes admins)"));
  }
  const double ttl = req->ttl_seconds() == 0 ? 24 * 3600.0 : req->ttl_seconds();
  const int uses = req->uses() == 0 ? 1 : req->uses();
  if (ttl < 0 || ttl > 365 * 24 * 3600.0 || uses < 0 || uses > 100000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ttl must be in (0, 1 year], uses in [1, 100000]");
  }
  const std::string token = security::NewToken();
  const double now = UnixNow();
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = store_->PutToken(security::TokenHash(token), role, now + ttl, uses, now); !s.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
    }
  }
  Log(absl::StrCat("join token made by ", who.name, ": role ", role, ", ", uses, " use(s), valid ",
                   absl::FormatDuration(absl::Seconds(ttl))));
  resp->set_token(token);
  resp->set_expires_unix(now + ttl);
  resp->set_role(role);
  resp->set_uses(uses);
  resp->set_ca_fingerprint(opt_.ca->fingerprint());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CreateIdentity(grpc::ServerContext* ctx, const v1::CreateIdentityRequest* req,
                                                v1::CreateIdentityResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kAdmin, &who, "CreateIdentity"); !s.ok()) return s;
  if (opt_.ca == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this coordinator runs with --insecure: no identities");
  }
  absl::StatusOr<security::Role> role = security::ParseRole(req->role());
  if (!role.ok() || *role == security::Role::kCoordinator) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("role \"", req->role(), "\": want admin, read-only or worker"));
  }
  std::vector<std::string> dns;
  if (*role == security::Role::kWorker) dns = security::WorkerDnsNames(req->name());
  if (!(req->ttl_seconds() >= 0 && req->ttl_seconds() <= 10 * 365 * 24 * 3600.0)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ttl must be in (0, 10 years]");
  }
  const absl::Duration ttl = req->ttl_seconds() > 0 ? absl::Seconds(req->ttl_seconds()) : kCertificateValidity;
  absl::StatusOr<std::string> cert = opt_.ca->Sign(req->csr_pem(), {req->name(), *role}, ttl, dns);
  if (!cert.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(cert.status().message()));
  {
    // An admin may give a name again (a replacement identity); a join under it is refused from now.
    absl::MutexLock l(&mu_);
    if (absl::Status s = store_->PutIssued(req->name(), req->role(), UnixNow()); !s.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message()));
    }
  }
  Log(absl::StrCat("identity ", req->name(), " (role ", req->role(), ") made by ", who.name));
  resp->set_certificate_pem(*cert);
  resp->set_ca_pem(opt_.ca->cert_pem());
  return grpc::Status::OK;
}

}  // namespace longhaul::coordinator
