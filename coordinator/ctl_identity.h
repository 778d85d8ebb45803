// `longhaulctl token create` and `longhaulctl identity create` (admin; docs/security.md).
#ifndef LONGHAUL_COORDINATOR_CTL_IDENTITY_H_
#define LONGHAUL_COORDINATOR_CTL_IDENTITY_H_

#include <string>

#include <CLI/CLI.hpp>

namespace longhaul::coordinator {

struct IdentityFlags {
  std::string ttl = "24h";     // token create
  std::string identity_ttl;    // identity create; "" = 1 year
  std::string role;
  int uses = 1;
  std::string name, out;
};
// Adds `token` (with `create`) and `identity` (with `create`); returns them.
std::pair<CLI::App*, CLI::App*> AddIdentityCommands(CLI::App& app, IdentityFlags* f);
int RunTokenCreate(const std::string& coordinator, const IdentityFlags& f);
int RunIdentityCreate(const std::string& coordinator, const IdentityFlags& f);

}  // namespace longhaul::coordinator

#endif  // LONGHAUL_COORDINATOR_CTL_IDENTITY_H_
