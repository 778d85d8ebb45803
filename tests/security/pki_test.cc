// The cluster CA, certificate requests, identities, fingerprints and join tokens (security/pki.h),
// and the state file's token table (coordinator/store.h).
#include "security/pki.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/list_dir.h"
#include "coordinator/store.h"

namespace longhaul::security {
namespace {

std::string TempDir() {
  std::string t = "/tmp/longhaul-pki-test-XXXXXX";
  return mkdtemp(t.data());
}

TEST(PkiTest, SignsARequestWithTheNameAndRoleTheCaChooses) {
  absl::StatusOr<CertificateAuthority> ca = CertificateAuthority::Create("test CA");
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<std::string> key = NewPrivateKey();
  ASSERT_TRUE(key.ok());
  absl::StatusOr<std::string> csr = MakeCsr(*key, "asked-for-name");
  ASSERT_TRUE(csr.ok()) << csr.status();
  // The subject comes from the CA, not from the request.
  absl::StatusOr<std::string> cert = ca->Sign(*csr, {"w0", Role::kWorker}, absl::Hours(1), {kWorkerServerName});
  ASSERT_TRUE(cert.ok()) << cert.status();
  absl::StatusOr<Identity> who = CertificateIdentity(*cert);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->name, "w0");
  EXPECT_EQ(who->role, Role::kWorker);
  EXPECT_TRUE(ca->Verify(*cert).ok());

  // Another CA's certificate does not verify.
  absl::StatusOr<CertificateAuthority> other = CertificateAuthority::Create("other CA");
  ASSERT_TRUE(other.ok());
  absl::StatusOr<KeyAndCert> foreign = other->Issue({"w0", Role::kWorker}, absl::Hours(1));
  ASSERT_TRUE(foreign.ok());
  absl::Status s = ca->Verify(foreign->cert_pem);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(ca->fingerprint(), other->fingerprint());
}

TEST(PkiTest, RefusesABadRequestAndBadNames) {
  absl::StatusOr<CertificateAuthority> ca = CertificateAuthority::Create("test CA");
  ASSERT_TRUE(ca.ok());
  EXPECT_FALSE(ca->Sign("not a request", {"w0", Role::kWorker}, absl::Hours(1)).ok());
  absl::StatusOr<std::string> key = NewPrivateKey();
  absl::StatusOr<std::string> csr = MakeCsr(*key, "w0");
  ASSERT_TRUE(csr.ok());
  // A request whose signature was tampered with (proof of possession fails).
  std::string bad = *csr;
  bad[bad.size() / 2] = bad[bad.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(ca->Sign(bad, {"w0", Role::kWorker}, absl::Hours(1)).ok());
  EXPECT_FALSE(ca->Sign(*csr, {"bad name/..", Role::kWorker}, absl::Hours(1)).ok());
  EXPECT_FALSE(CheckIdentityName("").ok());
  EXPECT_FALSE(CheckIdentityName(std::string(65, 'a')).ok());
  EXPECT_TRUE(CheckIdentityName("worker-0.eu_west").ok());
  // The servers' names are the CA's own (a certificate without a DNS name is matched by its CN).
  EXPECT_FALSE(CheckIdentityName(kCoordinatorServerName).ok());
  EXPECT_FALSE(CheckIdentityName("x.WORKER.longhaul").ok());
  EXPECT_FALSE(ca->Sign(*csr, {kCoordinatorServerName, Role::kReadOnly}, absl::Hours(1)).ok());
  EXPECT_TRUE(CheckCsr(*csr).ok());
  EXPECT_FALSE(CheckCsr(bad).ok());
  EXPECT_FALSE(CheckCsr("").ok());
}

TEST(PkiTest, FingerprintsAreSha256OfTheCertificateAndParseLeniently) {
  absl::StatusOr<CertificateAuthority> ca = CertificateAuthority::Create("test CA");
  ASSERT_TRUE(ca.ok());
  const std::string fp = ca->fingerprint();
  ASSERT_TRUE(absl::StartsWith(fp, "sha256:")) << fp;
  EXPECT_EQ(fp.size(), 7u + 64u);
  std::string upper_colons;
  for (size_t i = 7; i < fp.size(); i += 2) absl::StrAppend(&upper_colons, i > 7 ? ":" : "", fp.substr(i, 2));
  for (char& c : upper_colons) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(*NormalizeFingerprint(upper_colons), fp);
  EXPECT_EQ(*NormalizeFingerprint(fp.substr(7)), fp);
  EXPECT_FALSE(NormalizeFingerprint("sha256:1234").ok());
  EXPECT_FALSE(NormalizeFingerprint(std::string(64, 'g')).ok());
}

TEST(PkiTest, ClusterPkiIsMadeOnceWithPrivateKeys) {
  const std::string dir = TempDir() + "/pki";
  absl::StatusOr<ClusterPki> first = OpenClusterPki(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  for (const char* f : {"ca.key", "coordinator.key", "admin.key"}) {
    struct stat st {};
    ASSERT_EQ(stat((dir + "/" + f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  struct stat st {};
  ASSERT_EQ(stat((dir + "/ca.crt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(CertificateIdentity(first->admin.cert_pem)->role, Role::kAdmin);
  EXPECT_EQ(CertificateIdentity(first->server.cert_pem)->role, Role::kCoordinator);

  absl::StatusOr<ClusterPki> again = OpenClusterPki(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->ca.fingerprint(), first->ca.fingerprint());
  EXPECT_EQ(again->admin.cert_pem, first->admin.cert_pem);
  // A key that is not the certificate's (a crash between writing the two): the pair is made anew.
  ASSERT_TRUE(WriteFileAtomic(dir + "/admin.key", *NewPrivateKey(), 0600).ok());
  absl::StatusOr<ClusterPki> repaired = OpenClusterPki(dir);
  ASSERT_TRUE(repaired.ok()) << repaired.status();
  EXPECT_NE(repaired->admin.cert_pem, first->admin.cert_pem);
  EXPECT_EQ(repaired->ca.fingerprint(), first->ca.fingerprint());
  absl::StatusOr<ClusterPki> stable = OpenClusterPki(dir);
  ASSERT_TRUE(stable.ok());
  EXPECT_EQ(stable->admin.cert_pem, repaired->admin.cert_pem);
  (void)common::RemoveTree(dir.substr(0, dir.rfind('/')));
}

TEST(PkiTest, TokensAreRandomAndStoredHashed) {
  const std::string a = NewToken(), b = NewToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(TokenHash(a), TokenHash(a));
  EXPECT_NE(TokenHash(a), TokenHash(b));
  EXPECT_NE(TokenHash(a), a);
}

TEST(StoreTokenTest, UnknownExpiredAndUsedUpTokensAreRefused) {
  const std::string dir = TempDir();
  absl::StatusOr<std::unique_ptr<coordinator::Store>> store = coordinator::Store::Open(dir + "/state.db");
  ASSERT_TRUE(store.ok()) << store.status();
  coordinator::Store& s = **store;
  ASSERT_TRUE(s.PutToken(TokenHash("two-uses"), "worker", 1000, 2, 100).ok());
  ASSERT_TRUE(s.PutToken(TokenHash("expired"), "worker", 150, 5, 100).ok());
  EXPECT_EQ(*s.UseToken(TokenHash("two-uses"), 200), "worker");
  EXPECT_EQ(*s.UseToken(TokenHash("two-uses"), 200), "worker");
  absl::StatusOr<std::string> r = s.UseToken(TokenHash("two-uses"), 200);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("used up"), std::string::npos) << r.status();
  r = s.UseToken(TokenHash("expired"), 200);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expired 50 s ago"), std::string::npos) << r.status();
  r = s.UseToken(TokenHash("never made"), 200);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown join token"), std::string::npos) << r.status();
  store->reset();
  // Uses survive a restart (the state file).
  store = coordinator::Store::Open(dir + "/state.db");
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE((*store)->UseToken(TokenHash("two-uses"), 200).ok());
  store->reset();
  (void)common::RemoveTree(dir);
}

}  // namespace
}  // namespace longhaul::security
