// Worker-to-worker channels that name the worker they mean to reach (security::DataPlaneChannel's
// peer_name, WorkerServerName in every worker certificate), and collective groups that take each
// rank's messages only from that rank's certificate (collective/grpc_transport.h, names). The
// process has one data-plane identity, worker "c", and serves a Collective service with it.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collective/grpc_transport.h"
#include "security/pki.h"
#include "security/tls.h"

namespace longhaul::security {
namespace {

using collective::CollectiveService;
using collective::GrpcTransport;
using collective::GrpcTransportOptions;

TEST(WorkerServerNameTest, IsPerNameCaseSensitiveAndInTheWorkersCertificate) {
  EXPECT_EQ(WorkerServerName("w0"), WorkerServerName("w0"));
  EXPECT_NE(WorkerServerName("w0"), WorkerServerName("W0"));  // DNS matching would not tell them apart
  EXPECT_TRUE(absl::EndsWith(WorkerServerName("w0"), ".worker.longhaul"));
  absl::StatusOr<CertificateAuthority> ca = CertificateAuthority::Create("test CA");
  ASSERT_TRUE(ca.ok());
  absl::StatusOr<KeyAndCert> w0 = ca->Issue({"w0", Role::kWorker}, absl::Hours(1), WorkerDnsNames("w0"));
  ASSERT_TRUE(w0.ok()) << w0.status();
  EXPECT_TRUE(CertificateHasDnsName(w0->cert_pem, WorkerServerName("w0")));
  EXPECT_TRUE(CertificateHasDnsName(w0->cert_pem, kWorkerServerName));
  EXPECT_FALSE(CertificateHasDnsName(w0->cert_pem, WorkerServerName("w1")));
  EXPECT_FALSE(CertificateHasDnsName("not a certificate", WorkerServerName("w0")));
}

class DataPlaneNamesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<CertificateAuthority> ca = CertificateAuthority::Create("test CA");
    ASSERT_TRUE(ca.ok());
    absl::StatusOr<KeyAndCert> own = ca->Issue({"c", Role::kWorker}, absl::Hours(1), WorkerDnsNames("c"));
    ASSERT_TRUE(own.ok()) << own.status();
    SetDataPlaneIdentity(ca->cert_pem(), *own);
  }

  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", DataPlaneServerCredentials(), &port);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port > 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  // Rank `rank` of `group`, both ranks served here, ranks' worker names `names`.
  std::unique_ptr<GrpcTransport> Rank(const std::string& group, int rank, std::vector<std::string> names) {
    GrpcTransportOptions o;
    o.group = group;
    o.rank = rank;
    o.addresses = {address_, address_};
    o.names = std::move(names);
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t = GrpcTransport::Create(&service_, o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  CollectiveService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(DataPlaneNamesTest, MessagesBetweenTheNamedWorkersArrive) {
  std::unique_ptr<GrpcTransport> r0 = Rank("ok", 0, {"c", "c"}), r1 = Rank("ok", 1, {"c", "c"});
  ASSERT_TRUE(r0 && r1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(r0->Send(1, 7, "hello", deadline).ok());
  absl::StatusOr<std::string> m = r1->Recv(0, 7, deadline);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, "hello");
}

TEST_F(DataPlaneNamesTest, AMessageFromAnotherWorkersCertificateIsRefused) {
  // Rank 0 is worker "x"; this process (worker "c") sends as rank 0.
  std::unique_ptr<GrpcTransport> r0 = Rank("g", 0, {"x", "c"}), r1 = Rank("g", 1, {"x", "c"});
  ASSERT_TRUE(r0 && r1);
  absl::Status s = r0->Send(1, 7, "forged", absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "is worker x, not c")) << s;
  // Nothing reached rank 1, and its mailbox is not poisoned by the forger.
  absl::StatusOr<std::string> m = r1->Recv(0, 7, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
}

TEST_F(DataPlaneNamesTest, ASenderDoesNotTalkToAServerThatIsNotTheNamedWorker) {
  // Rank 1 should be worker "x", but the server at its address is worker "c".
  std::unique_ptr<GrpcTransport> r0 = Rank("s", 0, {"c", "x"}), r1 = Rank("s", 1, {"c", "x"});
  ASSERT_TRUE(r0 && r1);
  absl::Status s = r0->Send(1, 7, "secret", absl::Now() + absl::Seconds(3));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "x at ")) << s;  // names the worker it meant to reach
  absl::StatusOr<std::string> m = r1->Recv(0, 7, absl::Now() + absl::Milliseconds(300));
  EXPECT_FALSE(m.ok());
}

}  // namespace
}  // namespace longhaul::security
