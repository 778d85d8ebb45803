// Identity and transport security against a real cluster of processes over real gRPC (issue 19,
// docs/security.md): a job end to end over mutual TLS, workers refused without a valid token or with
// another cluster's certificate, clients without credentials or with too small a role refused, a
// worker's session not taken over by its id, a data-plane stream from a worker that is not the
// stage's neighbour refused with the job unaffected, a spec's paths outside the workers' data
// directories refused, plaintext refused off loopback.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "longhaul/v1/data_plane.grpc.pb.h"
#include "security/pki.h"
#include "security/tls.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

std::string Spec(int steps, int stages = 2) {
  return absl::StrCat(R"(name: tls
model: {layers: 2, hidden: 32, heads: 2, context: 16}
stages: )", stages, R"(
schedule: 1f1b
micro_batches: 2
micro_batch_size: 2
codecs: {forward: "fp32", backward: "fp32"}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 2, clip_norm: 1.0}
steps: )", steps, R"(
seed: 7
)");
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

grpc::ClientContext* Deadline(grpc::ClientContext* c, double s = 10) {
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(s)));
  return c;
}

class SecurityTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) c_.DumpLogs();
  }
  std::string Ca() { return ReadAll(c_.pki_dir() + "/ca.crt"); }
  // A stub to the coordinator presenting `own` (none: TLS without a client certificate).
  std::unique_ptr<v1::Coordinator::Stub> Stub(const security::KeyAndCert* own) {
    return v1::Coordinator::NewStub(security::SecureChannel(c_.address(), security::ChannelCredentials(Ca(), own),
                                                            security::kCoordinatorServerName, grpc::ChannelArguments()));
  }
  // A worker-role identity `name` got through Join with the cluster's token (what any holder of a
  // token can get: another worker of the cluster).
  security::KeyAndCert JoinAs(const std::string& name) {
    security::KeyAndCert id;
    id.key_pem = *security::NewPrivateKey();
    v1::JoinRequest req;
    req.set_token(c_.join_token());
    req.set_name(name);
    req.set_csr_pem(*security::MakeCsr(id.key_pem, name));
    v1::JoinResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = Stub(nullptr)->Join(Deadline(&ctx), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    id.cert_pem = resp.certificate_pem();
    return id;
  }
  // Starts a worker with `flags` (no token from the environment) and returns its exit code and log.
  std::pair<int, std::string> RunWorker(const std::string& name, const std::vector<std::string>& flags) {
    unsetenv("LONGHAUL_JOIN_TOKEN");
    unsetenv("LONGHAUL_CA_FINGERPRINT");
    std::vector<std::string> argv = {Cluster::Bin("longhaul-worker"), absl::StrCat("--coordinator=", c_.address()),
                                     "--listen=127.0.0.1:0", absl::StrCat("--name=", name),
                                     absl::StrCat("--data-dir=", c_.dir(), "/", name), "--metrics-listen=none",
                                     "--probe-listen=none", "--threads=1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string log = absl::StrCat(c_.dir(), "/", name, ".log");
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(argv, log);
    EXPECT_TRUE(p.ok());
    int rc = (*p)->Wait(absl::Seconds(20));
    if (rc < 0) (*p)->Signal(SIGKILL);
    return {rc, ReadAll(log)};
  }
  Cluster c_;
};

TEST_F(SecurityTest, JobRunsEndToEndOverMutualTls) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  EXPECT_NE(ReadAll(c_.dir() + "/coordinator.log").find("CA fingerprint " + c_.ca_fingerprint()), std::string::npos);
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(4));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(3));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_EQ(st->step(), 4);
  // The workers' servers take no plaintext: a plaintext client cannot open a stream.
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  auto plain = v1::StageLink::NewStub(grpc::CreateChannel(ws->at(0).info().address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = plain->Stream(Deadline(&ctx, 5));
  v1::TensorFrameChunk chunk;
  chunk.set_job_id(*job);
  stream->Write(chunk);
  stream->WritesDone();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, WorkersWithoutAValidTokenOrWithAnotherClustersCertificateAreRefused) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  const std::string fp = absl::StrCat("--ca-fingerprint=", c_.ca_fingerprint());
  auto [rc, log] = RunWorker("no-token", {});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("no identity"), std::string::npos) << log;
  EXPECT_NE(log.find("--join-token"), std::string::npos) << log;

  std::tie(rc, log) = RunWorker("wrong-token", {"--join-token=0123456789abcdef", fp});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("join refused by the coordinator"), std::string::npos) << log;
  EXPECT_NE(log.find("unknown join token"), std::string::npos) << log;

  {  // expired
    v1::CreateTokenRequest req;
    req.set_ttl_seconds(0.5);
    v1::CreateTokenResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(c_.stub().CreateToken(Deadline(&ctx), req, &resp).ok());
    absl::SleepFor(absl::Seconds(1.5));
    std::tie(rc, log) = RunWorker("late", {absl::StrCat("--join-token=", resp.token()), fp});
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("join token expired"), std::string::npos) << log;
  }
  {  // used up: one use, two workers
    v1::CreateTokenRequest req;
    req.set_uses(1);
    v1::CreateTokenResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(c_.stub().CreateToken(Deadline(&ctx), req, &resp).ok());
    unsetenv("LONGHAUL_JOIN_TOKEN");
    std::vector<std::string> argv = {Cluster::Bin("longhaul-worker"), absl::StrCat("--coordinator=", c_.address()),
                                     "--listen=127.0.0.1:0", "--name=first", absl::StrCat("--data-dir=", c_.dir(), "/first"),
                                     "--metrics-listen=none", "--probe-listen=none", "--threads=1",
                                     absl::StrCat("--join-token=", resp.token()), fp};
    absl::StatusOr<std::unique_ptr<Process>> first = Process::Spawn(argv, c_.dir() + "/first.log");
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE(c_.WaitForIdleWorkers(1, absl::Seconds(30)).ok()) << ReadAll(c_.dir() + "/first.log");
    std::tie(rc, log) = RunWorker("second", {absl::StrCat("--join-token=", resp.token()), fp});
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find("join token used up"), std::string::npos) << log;
  }
  // The wrong CA fingerprint: the worker does not trust this coordinator, and sends it nothing.
  std::tie(rc, log) = RunWorker("wrong-fp", {absl::StrCat("--join-token=", c_.join_token()),
                                             absl::StrCat("--ca-fingerprint=sha256:", std::string(64, '0'))});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("is not the one expected: its CA fingerprint is " + c_.ca_fingerprint()), std::string::npos) << log;

  // A certificate of another cluster's CA in the worker's data directory.
  absl::StatusOr<security::CertificateAuthority> other = security::CertificateAuthority::Create("other cluster");
  ASSERT_TRUE(other.ok());
  absl::StatusOr<security::KeyAndCert> foreign =
      other->Issue({"foreign", security::Role::kWorker}, absl::Hours(1), security::WorkerDnsNames("foreign"));
  ASSERT_TRUE(foreign.ok());
  const std::string tls = c_.dir() + "/foreign/tls";
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", tls).c_str()), 0);
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/ca.crt", other->cert_pem(), 0644).ok());
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/worker.crt", foreign->cert_pem, 0644).ok());
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/worker.key", foreign->key_pem, 0600).ok());
  std::tie(rc, log) = RunWorker("foreign", {});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("from another cluster"), std::string::npos) << log;

  // A name is certified once (its holder would pass as that worker), and the servers' names are
  // nobody's: a certificate named coordinator.longhaul would be matched by its CN.
  auto join = [&](const std::string& name) {
    v1::JoinRequest req;
    req.set_token(c_.join_token());
    req.set_name(name);
    req.set_csr_pem(*security::MakeCsr(*security::NewPrivateKey(), "any"));  // the CA ignores its subject
    v1::JoinResponse resp;
    grpc::ClientContext ctx;
    return Stub(nullptr)->Join(Deadline(&ctx), req, &resp);
  };
  grpc::Status s = join("first");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_NE(s.error_message().find("was given a certificate already"), std::string::npos) << s.error_message();
  for (const char* reserved : {"coordinator.longhaul", "Worker.Longhaul"}) {
    s = join(reserved);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << reserved << ": " << s.error_message();
  }

  // The coordinator's side: each refused join is logged with its reason; none of them registered.
  const std::string clog = ReadAll(c_.dir() + "/coordinator.log");
  for (const char* why : {"join of wrong-token from", "unknown join token", "join token expired", "join token used up"}) {
    EXPECT_NE(clog.find(why), std::string::npos) << why << "\n" << clog;
  }
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(ws->size(), 1u);
  EXPECT_EQ(ws->at(0).info().name(), "first");
}

TEST_F(SecurityTest, AStoredCertificateWithoutTheWorkersOwnNameIsRenewedAtStartUp) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  // A certificate as an older coordinator issued them: the shared worker name only.
  absl::StatusOr<security::ClusterPki> pki = security::OpenClusterPki(c_.pki_dir());
  ASSERT_TRUE(pki.ok()) << pki.status();
  absl::StatusOr<security::KeyAndCert> old =
      pki->ca.Issue({"veteran", security::Role::kWorker}, absl::Hours(1), {security::kWorkerServerName});
  ASSERT_TRUE(old.ok());
  const std::string tls = c_.dir() + "/veteran/tls";
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", tls).c_str()), 0);
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/ca.crt", pki->ca.cert_pem(), 0644).ok());
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/worker.crt", old->cert_pem, 0644).ok());
  ASSERT_TRUE(security::WriteFileAtomic(tls + "/worker.key", old->key_pem, 0600).ok());
  unsetenv("LONGHAUL_JOIN_TOKEN");  // no token: the stored certificate is all it has
  const std::string log = c_.dir() + "/veteran.log";
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Spawn(
      {Cluster::Bin("longhaul-worker"), absl::StrCat("--coordinator=", c_.address()), "--listen=127.0.0.1:0",
       "--name=veteran", absl::StrCat("--data-dir=", c_.dir(), "/veteran"), "--metrics-listen=none",
       "--probe-listen=none", "--threads=1"},
      log);
  ASSERT_TRUE(p.ok());
  bool registered = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(20); !registered && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
    for (const auto& w : ws.ok() ? *ws : std::vector<v1::WorkerStatus>{}) registered |= w.info().name() == "veteran";
  }
  EXPECT_TRUE(registered) << ReadAll(log);
  EXPECT_NE(ReadAll(log).find("renewed its certificate (the old one lacks this worker's own DNS name"), std::string::npos)
      << ReadAll(log);
  const std::string renewed = ReadAll(tls + "/worker.crt");
  EXPECT_TRUE(security::CertificateHasDnsName(renewed, security::WorkerServerName("veteran")));
  EXPECT_NE(ReadAll(tls + "/worker.key"), old->key_pem);  // a new key
  EXPECT_NE(ReadAll(c_.dir() + "/coordinator.log").find("renewed the certificate of worker veteran"), std::string::npos);

  // Renew gives worker certificates only, to the holder of one: a read-only identity is refused.
  const security::KeyAndCert viewer = [&] {
    absl::StatusOr<security::KeyAndCert> v = pki->ca.Issue({"viewer-r", security::Role::kReadOnly}, absl::Hours(1));
    return v.ok() ? *v : security::KeyAndCert{};
  }();
  v1::RenewRequest req;
  req.set_csr_pem(*security::MakeCsr(*security::NewPrivateKey(), "any"));
  v1::JoinResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = Stub(&viewer)->Renew(Deadline(&ctx), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  grpc::ClientContext ctx2;
  s = Stub(nullptr)->Renew(Deadline(&ctx2), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
}

TEST_F(SecurityTest, ClientsWithoutCredentialsOrTheRightRoleAreRefused) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(1).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(1000, 2));  // waits for a second worker
  ASSERT_TRUE(job.ok()) << job.status();

  // No client certificate: no cancel, no register, no listing.
  auto anon = Stub(nullptr);
  {
    v1::CancelJobRequest req;
    req.set_job_id(*job);
    v1::CancelJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = anon->CancelJob(Deadline(&ctx), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_NE(s.error_message().find("needs a client certificate"), std::string::npos) << s.error_message();
  }
  {
    v1::RegisterRequest req;
    req.mutable_info()->set_name("fake");
    req.mutable_info()->set_address("127.0.0.1:1");
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(anon->Register(Deadline(&ctx), req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Plaintext: no handshake at all.
  {
    auto plain = v1::Coordinator::NewStub(grpc::CreateChannel(c_.address(), grpc::InsecureChannelCredentials()));
    v1::CancelJobRequest req;
    req.set_job_id(*job);
    v1::CancelJobResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(plain->CancelJob(Deadline(&ctx, 5), req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // A read-only identity (longhaulctl identity create): status yes, cancel no.
  const std::string out = c_.dir() + "/viewer";
  auto [rc, text] = Cluster::Run(absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(),
                                              " identity create --role=read-only --name=viewer --out=", out, " 2>&1"));
  ASSERT_EQ(rc, 0) << text;
  const std::string as_viewer = absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c_.address(), " --cert=",
                                             out, "/viewer.crt --key=", out, "/viewer.key --ca=", out, "/ca.crt ");
  std::tie(rc, text) = Cluster::Run(absl::StrCat(as_viewer, "status ", *job, " 2>&1"));
  EXPECT_EQ(rc, 0) << text;
  std::tie(rc, text) = Cluster::Run(absl::StrCat(as_viewer, "cancel ", *job, " 2>&1"));
  EXPECT_NE(rc, 0) << text;
  EXPECT_NE(text.find("CancelJob needs role admin; the certificate of viewer has role read-only"), std::string::npos)
      << text;
  std::tie(rc, text) = Cluster::Run(absl::StrCat(as_viewer, "token create 2>&1"));
  EXPECT_NE(rc, 0) << text;
  // A worker's certificate cannot submit or cancel either.
  const security::KeyAndCert w = JoinAs("some-worker");
  {
    v1::CancelJobRequest req;
    req.set_job_id(*job);
    v1::CancelJobResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(Stub(&w)->CancelJob(Deadline(&ctx), req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  absl::StatusOr<v1::JobStatus> st = c_.Get(*job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::JOB_STATE_PENDING);
}

TEST_F(SecurityTest, AWorkersSessionCannotBeTakenOverByItsId) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(1).ok());
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  const uint64_t victim = ws->at(0).worker_id();
  const security::KeyAndCert evil = JoinAs("evil");
  auto stub = Stub(&evil);
  {  // registering under the victim's name
    v1::RegisterRequest req;
    req.mutable_info()->set_name("w0");
    req.mutable_info()->set_address("127.0.0.1:1");
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub->Register(Deadline(&ctx), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("cannot register as w0"), std::string::npos) << s.error_message();
  }
  {  // opening a session with the victim's id
    grpc::ClientContext ctx;
    auto session = stub->Session(Deadline(&ctx));
    v1::WorkerMessage m;
    m.set_worker_id(victim);
    m.mutable_heartbeat();
    session->Write(m);
    session->WritesDone();
    v1::CoordinatorMessage in;
    while (session->Read(&in)) {
    }
    grpc::Status s = session->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("belongs to w0"), std::string::npos) << s.error_message();
  }
  absl::SleepFor(absl::Seconds(1));
  ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(ws->size(), 1u);
  EXPECT_EQ(ws->at(0).state(), v1::WORKER_STATE_IDLE);  // the real w0 keeps its session
}

TEST_F(SecurityTest, AStreamFromAWorkerThatIsNotTheNeighbourIsRefusedAndTheJobGoesOn) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> job = c_.Submit(Spec(30));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c_.WaitForStep(*job, 2, absl::Minutes(2));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::JOB_STATE_RUNNING);
  std::string stage1_address;
  absl::StatusOr<std::vector<v1::WorkerStatus>> ws = c_.Workers();
  ASSERT_TRUE(ws.ok());
  for (const auto& w : *ws) {
    if (w.worker_id() == st->stages(1).worker_id()) stage1_address = w.info().address();
  }
  ASSERT_FALSE(stage1_address.empty());
  // A worker of this cluster (it holds a valid certificate), but not stage 0's: one chunk that would
  // have broken stage 1's link before.
  auto send_as = [&](const security::KeyAndCert& id) {
    auto stub = v1::StageLink::NewStub(security::SecureChannel(stage1_address, security::ChannelCredentials(Ca(), &id),
                                                               security::kWorkerServerName, grpc::ChannelArguments()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("longhaul-attempt", "0");
    auto stream = stub->Stream(Deadline(&ctx));
    v1::TensorFrameChunk chunk;
    chunk.set_job_id(*job);
    chunk.set_from_stage(0);
    chunk.set_step(3);
    chunk.set_chunk_count(1);
    chunk.set_frame_bytes(16);
    chunk.set_data(std::string(16, 'x'));
    stream->Write(chunk);
    stream->WritesDone();
    v1::FrameAck ack;
    while (stream->Read(&ack)) {
    }
    return stream->Finish();
  };
  grpc::Status s = send_as(JoinAs("intruder"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("not from intruder"), std::string::npos) << s.error_message();
  // An admin certificate is no worker: refused before any handler.
  security::KeyAndCert admin{ReadAll(c_.pki_dir() + "/admin.key"), ReadAll(c_.pki_dir() + "/admin.crt")};
  s = send_as(admin);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  st = c_.WaitForEnd(*job, absl::Minutes(3));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
  EXPECT_EQ(st->restarts(), 0);
}

// A spec names paths on the workers' disks: a checkpoint directory or a corpus outside the worker's
// data directory (and its operator's --allow-paths) fails the job at once, naming the path, and
// nothing is written there.
TEST_F(SecurityTest, SpecPathsOutsideTheWorkersDataDirectoryAreRefused) {
  ASSERT_TRUE(c_.StartCoordinator().ok());
  ASSERT_TRUE(c_.StartWorkers(2).ok());
  const std::string outside = c_.dir() + "/outside";
  const struct {
    std::string yaml, refused;
  } attacks[] = {
      {absl::StrCat("checkpoint: {dir: ", outside, "}\n"), absl::StrCat("checkpoint.dir \"", outside)},
      {"data: {corpus: /etc}\n", "data.corpus \"/etc\" is refused"},
  };
  for (const auto& a : attacks) {
    absl::StatusOr<uint64_t> job = c_.Submit(Spec(4) + a.yaml);
    ASSERT_TRUE(job.ok()) << job.status();
    absl::StatusOr<v1::JobStatus> st = c_.WaitForEnd(*job, absl::Minutes(2));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->state(), v1::JOB_STATE_FAILED);
    EXPECT_NE(st->error().find(a.refused), std::string::npos) << st->error();
    EXPECT_EQ(st->restarts(), 0);
  }
  EXPECT_NE(access(outside.c_str(), F_OK), 0) << outside << " was created";
}

TEST(InsecureFlagTest, PlaintextIsRefusedOffLoopback) {
  auto [rc, out] = Cluster::Run(absl::StrCat("timeout 20 ", Cluster::Bin("longhaul-coordinator"),
                                             " --insecure --listen=0.0.0.0:0 --state=/tmp/longhaul-insecure-test.db 2>&1"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--insecure: plaintext only on loopback, but --listen is 0.0.0.0:0"), std::string::npos) << out;
  std::tie(rc, out) = Cluster::Run(absl::StrCat("timeout 20 ", Cluster::Bin("longhaul-worker"),
                                                " --insecure --listen=0.0.0.0:0 --metrics-listen=none 2>&1"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("plaintext only on loopback"), std::string::npos) << out;
  std::tie(rc, out) = Cluster::Run(
      absl::StrCat("timeout 20 ", Cluster::Bin("longhaulctl"), " --insecure --coordinator=10.1.2.3:7400 workers 2>&1"));
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("plaintext only to a coordinator on this machine"), std::string::npos) << out;
}

// The harness's other mode: plaintext on loopback, everything allowed.
TEST(InsecureClusterTest, AnInsecureClusterOnLoopbackRuns) {
  Cluster c;
  c.SetInsecure(true);
  ASSERT_TRUE(c.StartCoordinator().ok());
  ASSERT_TRUE(c.StartWorkers(2).ok());
  absl::StatusOr<uint64_t> job = c.Submit(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> st = c.WaitForEnd(*job, absl::Minutes(3));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_SUCCEEDED) << st->error();
}

}  // namespace
}  // namespace longhaul::cluster
