#include "coordinator/ctl_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/ctl_channel.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "security/pki.h"

namespace longhaul::coordinator {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "longhaulctl: %s\n", msg.c_str());
  return 1;
}

bool ParseTtl(const std::string& text, absl::Duration* d) {
  double s = 0;
  if (absl::SimpleAtod(text, &s)) {
    *d = absl::Seconds(s);
    return true;
  }
  return absl::ParseDuration(text, d);
}

}  // namespace

std::pair<CLI::App*, CLI::App*> AddIdentityCommands(CLI::App& app, IdentityFlags* f) {
  CLI::App* token = app.add_subcommand("token", "join tokens for new workers (admin)");
  token->require_subcommand(1);
  CLI::App* tc = token->add_subcommand(
      "create", "make a join token and print it with the CA fingerprint: a worker started with\n"
                "--join-token=TOKEN --ca-fingerprint=FP gets its certificate from the coordinator");
  tc->add_option("--ttl", f->ttl, "how long the token can be used (a DURATION: 30m, 24h, ...)")->type_name("DURATION");
  tc->add_option("--role", f->role, "the role it grants: worker (default) or read-only")->type_name("ROLE");
  tc->add_option("--uses", f->uses, "how many joins it allows")->type_name("N");
  CLI::App* identity = app.add_subcommand("identity", "certificates for longhaulctl users (admin)");
  identity->require_subcommand(1);
  CLI::App* ic = identity->add_subcommand(
      "create", "make a key here and have the coordinator's CA certify it: writes OUT/NAME.key (mode 0600),\n"
                "OUT/NAME.crt and OUT/ca.crt, for longhaulctl --key --cert --ca");
  ic->add_option("--role", f->role, "admin, read-only or worker")->type_name("ROLE")->required();
  ic->add_option("--name", f->name, "the identity's name (default: the role)")->type_name("NAME");
  ic->add_option("--out", f->out, "directory to write to (created)")->type_name("DIR")->required();
  ic->add_option("--ttl", f->identity_ttl, "validity (a DURATION; default 1 year)")->type_name("DURATION");
  return {tc, ic};
}

int RunTokenCreate(const std::string& coordinator, const IdentityFlags& f) {
  absl::Duration ttl;
  if (!ParseTtl(f.ttl, &ttl) || ttl <= absl::ZeroDuration()) return Fail(absl::StrCat("--ttl ", f.ttl, ": not a duration"));
  auto stub = v1::Coordinator::NewStub(CoordinatorChannel(coordinator));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::CreateTokenRequest req;
  req.set_ttl_seconds(absl::ToDoubleSeconds(ttl));
  req.set_role(f.role);
  req.set_uses(f.uses);
  v1::CreateTokenResponse r;
  grpc::Status s = stub->CreateToken(&ctx, req, &r);
  if (!s.ok()) return Fail(absl::StrCat("token create: ", s.error_message()));
  std::printf("%s\n", r.token().c_str());
  std::fprintf(stderr,
               "role %s, %d use(s), expires %s\nCA fingerprint %s\nstart a worker with: LONGHAUL_JOIN_TOKEN=<the token> "
               "longhaul-worker --coordinator=%s --ca-fingerprint=%s ...\n",
               r.role().c_str(), r.uses(),
               absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(static_cast<int64_t>(r.expires_unix())),
                                absl::UTCTimeZone())
                   .c_str(),
               r.ca_fingerprint().c_str(), coordinator.c_str(), r.ca_fingerprint().c_str());
  return 0;
}

int RunIdentityCreate(const std::string& coordinator, const IdentityFlags& f) {
  const std::string name = f.name.empty() ? f.role : f.name;
  absl::Duration ttl = absl::ZeroDuration();
  if (!f.identity_ttl.empty() && (!ParseTtl(f.identity_ttl, &ttl) || ttl <= absl::ZeroDuration())) {
    return Fail(absl::StrCat("--ttl ", f.identity_ttl, ": not a duration"));
  }
  absl::StatusOr<std::string> key = security::NewPrivateKey();
  if (!key.ok()) return Fail(std::string(key.status().message()));
  absl::StatusOr<std::string> csr = security::MakeCsr(*key, name);
  if (!csr.ok()) return Fail(std::string(csr.status().message()));
  auto stub = v1::Coordinator::NewStub(CoordinatorChannel(coordinator));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::CreateIdentityRequest req;
  req.set_name(name);
  req.set_role(f.role);
  req.set_csr_pem(*csr);
  req.set_ttl_seconds(absl::ToDoubleSeconds(ttl));
  v1::CreateIdentityResponse r;
  grpc::Status s = stub->CreateIdentity(&ctx, req, &r);
  if (!s.ok()) return Fail(absl::StrCat("identity create: ", s.error_message()));
  if (::mkdir(f.out.c_str(), 0700) != 0 && errno != EEXIST) {
    return Fail(absl::StrCat("cannot create ", f.out, ": ", std::strerror(errno)));
  }
  for (auto [file, text, mode] : {std::tuple{absl::StrCat(f.out, "/", name, ".crt"), &r.certificate_pem(), 0644u},
                                  std::tuple{absl::StrCat(f.out, "/ca.crt"), &r.ca_pem(), 0644u},
                                  std::tuple{absl::StrCat(f.out, "/", name, ".key"), static_cast<const std::string*>(&*key), 0600u}}) {
    if (absl::Status w = security::WriteFileAtomic(file, *text, mode); !w.ok()) return Fail(std::string(w.message()));
  }
  std::printf("%s/%s.key, %s/%s.crt (role %s), %s/ca.crt\n", f.out.c_str(), name.c_str(), f.out.c_str(), name.c_str(),
              f.role.c_str(), f.out.c_str());
  return 0;
}

}  // namespace longhaul::coordinator
