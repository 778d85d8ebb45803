// longhaulctl's connection to the coordinator: TLS with a client certificate (docs/security.md),
// or plaintext with --insecure. Every command makes its channel here.
//
//   CtlCredentialFlags f;  AddCredentialFlags(app, &f);   ... parse ...
//   if (absl::Status s = UseCredentials(f, coordinator); !s.ok()) ...
//   auto stub = v1::Coordinator::NewStub(CoordinatorChannel(coordinator));
#ifndef LONGHAUL_COORDINATOR_CTL_CHANNEL_H_
#define LONGHAUL_COORDINATOR_CTL_CHANNEL_H_

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace longhaul::coordinator {

struct CtlCredentialFlags {
  std::string pki_dir;  // the coordinator's --pki-dir: ca.crt, admin.crt, admin.key
  std::string ca, cert, key;
  bool insecure = false;
};
void AddCredentialFlags(CLI::App& app, CtlCredentialFlags* f);
// Resolves the defaults and loads the files (once, before any channel is made).
absl::Status UseCredentials(const CtlCredentialFlags& f, const std::string& coordinator);
std::shared_ptr<grpc::Channel> CoordinatorChannel(const std::string& coordinator);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_CTL_CHANNEL_H_
