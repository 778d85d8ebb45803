// The coordinator's link matrix and placement with fake workers on real Session streams (an
// in-process gRPC server): probe peer lists go out, link reports come in, ListLinks shows them
// (persisted in the state file), PlanJob predicts without starting anything, and a starting job is
// placed around a slow link, or in the naive order, saying why, when a link is unmeasured.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_worker.h"

namespace longhaul::coordinator {
namespace {

// Registered with a probe address and a compute speed, its Session open, keeping what it is sent.
class ProbingWorker : public FakeSession {
 public:
  ProbingWorker(v1::Coordinator::Stub& stub, const std::string& name, double gflops)
      : FakeSession(stub, Request(name, gflops)) {}

  void Report(uint64_t to, double mbit, double rtt_ms, const std::string& error = "") {
    v1::WorkerMessage m;
    m.mutable_link()->set_to_worker_id(to);
    m.mutable_link()->set_mbit_per_s(mbit);
    m.mutable_link()->set_rtt_ms(rtt_ms);
    m.mutable_link()->set_bytes(1 << 20);
    m.mutable_link()->set_error(error);
    Post(m);
  }
  // The peers of the latest ProbePeers message (ids).
  std::vector<uint64_t> peers() {
    const std::vector<v1::CoordinatorMessage> got = Received();
    for (auto it = got.rbegin(); it != got.rend(); ++it) {
      if (!it->has_probe_peers()) continue;
      std::vector<uint64_t> ids;
      for (const auto& p : it->probe_peers().peers()) ids.push_back(p.worker_id());
      return ids;
    }
    return {};
  }

 private:
  static v1::RegisterRequest Request(const std::string& name, double gflops) {
    v1::RegisterRequest req = Registration(name);
    req.mutable_info()->set_probe_address(absl::StrCat("127.0.0.1:", 1000 + name.size()));
    req.mutable_info()->set_compute_gflops(gflops);
    return req;
  }
};

class LinksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempStatePath("longhaul-links");
    auto store = Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions o;
    o.heartbeat_timeout = absl::Seconds(30);
    auto svc = CoordinatorService::Create(std::move(*store), o);
    ASSERT_TRUE(svc.ok()) << svc.status();
    svc_ = std::move(*svc);
    server_ = ServeOnLoopback(svc_.get(), &stub_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    workers_.clear();
    if (svc_) svc_->Stop();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    server_.reset();
    svc_.reset();
    RemoveStateFiles(path_);
  }
  ProbingWorker& Add(const std::string& name, double gflops = 100) {
    workers_.push_back(std::make_unique<ProbingWorker>(*stub_, name, gflops));
    return *workers_.back();
  }
  // Every directed pair: `fast` inside a region (ids in `a` or both not), `slow` between.
  void ReportAll(const std::set<uint64_t>& a, double fast, double slow) {
    for (auto& w : workers_) {
      for (auto& v : workers_) {
        if (w->id() == v->id()) continue;
        const bool same = a.count(w->id()) == a.count(v->id());
        w->Report(v->id(), same ? fast : slow, same ? 0.5 : 80);
      }
      w->Ping();
    }
  }
  std::string Spec(int stages) {
    return absl::StrCat("name: j\nstages: ", stages,
                        "\nmodel: {layers: 4, hidden: 256, context: 128}\nmicro_batches: 8\nmicro_batch_size: 8\n"
                        "codecs: {forward: fp32, backward: fp32}\nsteps: 5\n");
  }
  v1::JobStatus Job(uint64_t id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::JobStatus st;
    EXPECT_TRUE(svc_->GetJob(nullptr, &req, &st).ok());
    return st;
  }
  uint64_t Submit(int stages, const std::string& extra = "") {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(Spec(stages) + extra);
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(svc_->SubmitJob(nullptr, &req, &resp).ok());
    return resp.job_id();
  }

  std::string path_;
  std::unique_ptr<CoordinatorService> svc_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<ProbingWorker>> workers_;
};

TEST_F(LinksTest, PeersAreSentAndReportsFormThePersistedMatrix) {
  ProbingWorker& a = Add("a");
  ProbingWorker& b = Add("bb");
  a.Ping();
  EXPECT_EQ(a.peers(), (std::vector<uint64_t>{b.id()}));  // updated when b's session opened
  EXPECT_EQ(b.peers(), (std::vector<uint64_t>{a.id()}));
  a.Report(b.id(), 940, 0.2);
  b.Report(a.id(), 0, 0, "connection refused");
  a.Ping();
  b.Ping();
  v1::ListLinksResponse r;
  ASSERT_TRUE(svc_->ListLinks(nullptr, nullptr, &r).ok());
  EXPECT_EQ(r.workers_size(), 2);
  ASSERT_EQ(r.links_size(), 2);
  EXPECT_EQ(r.links(0).from_worker_id(), a.id());
  EXPECT_DOUBLE_EQ(r.links(0).mbit_per_s(), 940);
  EXPECT_GT(r.links(0).measured_unix(), 0);
  EXPECT_GE(r.links(0).age_seconds(), 0);
  EXPECT_EQ(r.links(1).error(), "connection refused");
  EXPECT_EQ(r.links(1).measured_unix(), 0);
  // A failed probe keeps the older measurement.
  a.Report(b.id(), 0, 0, "timed out");
  a.Ping();
  r.Clear();
  ASSERT_TRUE(svc_->ListLinks(nullptr, nullptr, &r).ok());
  EXPECT_DOUBLE_EQ(r.links(0).mbit_per_s(), 940);
  EXPECT_EQ(r.links(0).error(), "timed out");
  // In the state file.
  workers_.clear();
  svc_->Stop();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  server_.reset();
  svc_.reset();
  auto store = Store::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<v1::LinkMeasurement>> links = (*store)->LoadLinks();
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 2u);
  EXPECT_DOUBLE_EQ((*links)[0].mbit_per_s(), 940);
}

TEST_F(LinksTest, AJobIsPlacedAroundTheSlowLinkAndPlanJobSaysSo) {
  // Ids 1..6; 1, 3, 5 and 6 in one region, 2 and 4 in the other: the naive order (1, 2, 3, 4)
  // crosses the slow link three times, four stages fit in the first region.
  for (const char* n : {"w1", "w2", "w3", "w4", "w5", "w6"}) Add(n);
  const std::set<uint64_t> region = {workers_[0]->id(), workers_[2]->id(), workers_[4]->id(), workers_[5]->id()};
  ReportAll(region, 10000, 10);
  v1::PlanJobRequest req;
  req.set_spec_yaml(Spec(4));
  v1::PlanJobResponse plan;
  ASSERT_TRUE(svc_->PlanJob(nullptr, &req, &plan).ok());
  EXPECT_NE(plan.placement().find("bandwidth-aware: exact search"), std::string::npos) << plan.placement();
  ASSERT_EQ(plan.stages_size(), 4);
  ASSERT_EQ(plan.naive_stages_size(), 4);
  EXPECT_EQ(plan.naive_stages(1).worker_name(), "w2");
  EXPECT_GT(plan.naive_step_seconds(), 2 * plan.predicted_step_seconds());
  EXPECT_NE(plan.bottleneck().find("per micro-batch"), std::string::npos) << plan.bottleneck();
  for (const v1::PlannedStage& p : plan.stages()) EXPECT_EQ(region.count(p.worker_id()), 1u) << p.worker_name();
  // Nothing started: every worker is still idle; a submitted job takes the planned placement.
  const uint64_t job = Submit(4);
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.placement(), plan.placement());
  EXPECT_DOUBLE_EQ(st.predicted_step_seconds(), plan.predicted_step_seconds());
  for (int s = 0; s < 4; ++s) EXPECT_EQ(st.stages(s).worker_id(), plan.stages(s).worker_id());
}

// Replicated stages: the plan lists every replica's pipeline (slot r * stages + s, as the job's
// placement), each with its own links.
TEST_F(LinksTest, PlanJobListsEveryReplicasPipeline) {
  for (const char* n : {"w1", "w2", "w3", "w4"}) Add(n);
  ReportAll({}, 1000, 1000);
  v1::PlanJobRequest req;
  req.set_spec_yaml(Spec(2) + "replicas: 2\n");
  v1::PlanJobResponse plan;
  ASSERT_TRUE(svc_->PlanJob(nullptr, &req, &plan).ok());
  ASSERT_EQ(plan.stages_size(), 4);
  std::set<uint64_t> workers;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(plan.stages(i).stage(), i % 2);
    EXPECT_EQ(plan.stages(i).replica(), i / 2);
    workers.insert(plan.stages(i).worker_id());
    if (i % 2 == 0) {
      EXPECT_GT(plan.stages(i).mbit_per_s(), 0) << "replica " << i / 2 << "'s link to stage 1";
    }
  }
  EXPECT_EQ(workers.size(), 4u);
  const uint64_t job = Submit(2, "replicas: 2\n");
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.stages_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(st.stages(i).worker_id(), plan.stages(i).worker_id()) << "slot " << i;
}

// Replica counts that differ: every slot's compute, and each stage-0 slot's link is the slowest of
// those to the stage-1 replicas it streams to (here its one; w1 and w3 are in one region, w2 and
// w4 in the other, so whichever workers the plan picks, a slot's figures are its own link's).
TEST_F(LinksTest, PlanJobCostsEverySlotOfPerStageReplicaCounts) {
  for (const char* n : {"w1", "w2", "w3", "w4"}) Add(n);
  const std::set<uint64_t> region = {workers_[0]->id(), workers_[2]->id()};
  ReportAll(region, 1000, 10);
  v1::PlanJobRequest req;
  req.set_spec_yaml(Spec(2) + "replicas: [2, 1]\n");
  v1::PlanJobResponse plan;
  ASSERT_TRUE(svc_->PlanJob(nullptr, &req, &plan).ok());
  ASSERT_GT(plan.predicted_step_seconds(), 0);
  ASSERT_EQ(plan.stages_size(), 3);
  std::map<uint64_t, bool> in_region;
  for (auto& w : workers_) in_region[w->id()] = region.count(w->id()) > 0;
  const v1::PlannedStage& last = plan.stages(2);  // slots: (0, 0), (1, 0), (0, 1)
  ASSERT_EQ(last.stage(), 0);
  ASSERT_EQ(plan.stages(1).stage(), 1);
  for (const v1::PlannedStage& p : plan.stages()) {
    EXPECT_GT(p.compute_seconds(), 0) << "stage " << p.stage() << " replica " << p.replica();
    if (p.stage() == 1) {
      EXPECT_EQ(p.mbit_per_s(), 0);  // the last stage has no link to a next one
      continue;
    }
    EXPECT_GT(p.forward_seconds(), 0);
    EXPECT_GT(p.backward_seconds(), 0);
    const bool same = in_region[p.worker_id()] == in_region[plan.stages(1).worker_id()];
    EXPECT_DOUBLE_EQ(p.mbit_per_s(), same ? 1000 : 10) << p.worker_name() << " -> " << plan.stages(1).worker_name();
  }
  // [1, 2]: stage 0's one slot streams to both of stage 1's; each region has two workers, so one
  // of the three slots is in the other region, and stage 0's figures are its slowest link's.
  req.set_spec_yaml(Spec(2) + "replicas: [1, 2]\n");
  plan.Clear();
  ASSERT_TRUE(svc_->PlanJob(nullptr, &req, &plan).ok());
  ASSERT_EQ(plan.stages_size(), 3);
  ASSERT_EQ(plan.stages(0).stage(), 0);
  EXPECT_DOUBLE_EQ(plan.stages(0).mbit_per_s(), 10);
  EXPECT_GT(plan.stages(0).forward_seconds(), 0);
}

TEST_F(LinksTest, AnUnmeasuredLinkMeansTheNaiveOrderAndSaysWhich) {
  ProbingWorker& a = Add("a");
  ProbingWorker& b = Add("bb");
  Add("ccc");
  a.Report(b.id(), 1000, 1);
  a.Ping();
  const uint64_t job = Submit(2);
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st.placement(), "naive order: no link measurement between a and ccc yet");
  EXPECT_EQ(st.predicted_step_seconds(), 0);
  EXPECT_EQ(st.stages(0).worker_id(), a.id());
  EXPECT_EQ(st.stages(1).worker_id(), b.id());
}

TEST_F(LinksTest, EqualLinksKeepTheNaiveOrder) {
  for (const char* n : {"w1", "w2", "w3"}) Add(n);
  ReportAll({}, 1000, 1000);
  const uint64_t job = Submit(3);
  const v1::JobStatus st = Job(job);
  ASSERT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_NE(st.placement().find("naive order: no placement predicted more than 5% faster"), std::string::npos)
      << st.placement();
  EXPECT_GT(st.predicted_step_seconds(), 0);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(st.stages(s).worker_id(), workers_[s]->id());
}

TEST_F(LinksTest, PlanJobRejectsBadSpecsAndClustersTooSmall) {
  Add("a");
  v1::PlanJobRequest req;
  req.set_spec_yaml("stages: 0\n");
  v1::PlanJobResponse plan;
  EXPECT_EQ(svc_->PlanJob(nullptr, &req, &plan).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.set_spec_yaml(Spec(2));
  const grpc::Status s = svc_->PlanJob(nullptr, &req, &plan);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "the job needs 2 workers, only 1 live");
}

}  // namespace
}  // namespace longhaul::coordinator
