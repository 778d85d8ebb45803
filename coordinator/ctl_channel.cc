#include "coordinator/ctl_channel.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/read_file.h"
#include "proto/channel_config.h"
#include "security/tls.h"

namespace longhaul::coordinator {
namespace {

struct Loaded {
  bool insecure = true;
  std::string ca_pem;
  security::KeyAndCert own;
};
Loaded& Creds() {
  static Loaded* l = new Loaded;
  return *l;
}

// The coordinator's default --pki-dir as seen from here: ./longhaul-pki (a coordinator started in
// this directory with the default --state), else the systemd unit's.
std::string DefaultPkiDir() {
  for (const char* d : {"longhaul-pki", "/var/lib/longhaul-coordinator/longhaul-pki"}) {
    if (::access(absl::StrCat(d, "/admin.key").c_str(), R_OK) == 0) return d;
  }
  return "longhaul-pki";
}

}  // namespace

void AddCredentialFlags(CLI::App& app, CtlCredentialFlags* f) {
  app.add_option("--pki-dir", f->pki_dir,
                 "the coordinator's --pki-dir, for its admin identity (ca.crt, admin.crt, admin.key) when --ca, "
                 "--cert, --key are not given (else $LONGHAUL_PKI_DIR, else ./longhaul-pki or "
                 "/var/lib/longhaul-coordinator/longhaul-pki, whichever is readable)")
      ->type_name("DIR")
      ->envname("LONGHAUL_PKI_DIR");
  app.add_option("--ca", f->ca, "the cluster CA's certificate (default: PKI_DIR/ca.crt)")->type_name("PATH");
  app.add_option("--cert", f->cert, "this client's certificate (default: PKI_DIR/admin.crt)")->type_name("PATH");
  app.add_option("--key", f->key, "this client's private key (default: PKI_DIR/admin.key)")->type_name("PATH");
  app.add_flag("--insecure", f->insecure, "plaintext, no identity (a coordinator started with --insecure; loopback only)");
}

absl::Status UseCredentials(const CtlCredentialFlags& f, const std::string& coordinator) {
  Loaded& l = Creds();
  if (f.insecure) {
    if (!security::IsLoopbackTarget(coordinator)) {
      return absl::InvalidArgumentError(absl::StrCat("--insecure: plaintext only to a coordinator on this machine, not ",
                                                     coordinator));
    }
    l.insecure = true;
    return absl::OkStatus();
  }
  const std::string dir = f.pki_dir.empty() ? DefaultPkiDir() : f.pki_dir;
  const std::string ca = f.ca.empty() ? absl::StrCat(dir, "/ca.crt") : f.ca;
  const std::string cert = f.cert.empty() ? absl::StrCat(dir, "/admin.crt") : f.cert;
  const std::string key = f.key.empty() ? absl::StrCat(dir, "/admin.key") : f.key;
  for (auto [path, out] : {std::pair{&ca, &l.ca_pem}, std::pair{&cert, &l.own.cert_pem}, std::pair{&key, &l.own.key_pem}}) {
    absl::StatusOr<std::string> text = common::ReadFile(*path);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat(text.status().message(),
                                       "\n(longhaulctl authenticates with --cert/--key/--ca, or --pki-dir; see --help)"));
    }
    *out = *text;
  }
  l.insecure = false;
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> CoordinatorChannel(const std::string& coordinator) {
  const Loaded& l = Creds();
  if (l.insecure) return grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), LonghaulChannelArgs());
  return security::SecureChannel(coordinator, security::ChannelCredentials(l.ca_pem, &l.own),
                                 security::kCoordinatorServerName, LonghaulChannelArgs());
}

}  // namespace longhaul::coordinator
