// The coordinator's link matrix and placement: link reports from the workers' probers, the probe
// peer lists sent to them, ListLinks, PlanJob, and the choice of a starting job's workers
// (CoordinatorService::Place, called by Schedule). The model and solvers are placement.h's.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_cost.h"
#include "coordinator/job_spec.h"
#include "coordinator/placement_counts.h"
#include "stage_runtime/partition.h"

namespace longhaul::coordinator {
namespace {

// Assumed when no candidate reported its compute speed (so every worker is alike; only the
// absolute prediction depends on it).
constexpr double kAssumedGflops = 50;

struct Candidate {
  uint64_t id = 0;
  std::string name;
  std::string region;
  double gflops = 0;  // 0: not measured
};

// A placement decision over `cands`, with what PlanJob shows of it.
struct Decision {
  bool modelled = false;           // false: no prediction (a link unmeasured, a spec the model refuses)
  placement::Placement chosen;     // indices into the candidates, stage s at [s]
  placement::Placement naive;
  placement::JobShape job;
  std::vector<int> counts;         // replica counts that differ between stages (placement_counts.h); else empty
  placement::Cluster cluster;
  placement::Cost chosen_cost, naive_cost;
  std::string how;                 // JobStatus.placement
  std::string note;                // assumptions made
  double solve_seconds = 0;
};

std::string Ms(double s) { return std::isfinite(s) ? absl::StrFormat("%.3g ms", s * 1e3) : "forever"; }

// `link(i, j)`: the measurement of candidate i's link to candidate j, or null.
template <typename LinkFn>
Decision Decide(const v1::JobSpec& spec, const std::vector<Candidate>& cands, LinkFn link, double min_gain,
                const placement::SolveOptions& solve) {
  Decision d;
  // Replicated stages: K positions, the slots of proto/replica_layout.h (replica r's stage s at
  // r * stages + s with equal counts).
  const int K = WorkersNeeded(spec);
  for (int s = 0; s < K; ++s) d.naive.push_back(s);
  d.chosen = d.naive;
  absl::StatusOr<placement::JobShape> shape = JobShapeOf(spec);
  if (!shape.ok()) {
    d.how = absl::StrCat("naive order: the cost model cannot take this job (", shape.status().message(), ")");
    return d;
  }
  d.job = *shape;
  if (ReplicaCountsDiffer(spec)) {  // placement_counts.h: the whole step's micro-batches over the slots
    d.counts = ReplicaCounts(spec);
    d.job.micro_batches = spec.micro_batches();
  } else {  // placement.h: D pipelines, each running its share of the step's micro-batches
    d.job.replicas = StageReplicas(spec, 0);
    d.job.micro_batches = ReplicaMicroBatches(spec, 0);
  }
  const int N = static_cast<int>(cands.size());
  std::vector<double> known;
  for (const Candidate& c : cands) {
    if (c.gflops > 0) known.push_back(c.gflops);
  }
  double fill = kAssumedGflops;
  if (known.empty()) {
    d.note = absl::StrCat("no candidate reported its compute speed: assumed ", kAssumedGflops, " GFLOP/s each");
  } else if (known.size() < cands.size()) {
    std::sort(known.begin(), known.end());
    fill = known[known.size() / 2];
    d.note = absl::StrCat(cands.size() - known.size(), " candidate(s) did not report a compute speed: assumed the median, ",
                          absl::StrFormat("%.1f", fill), " GFLOP/s");
  }
  d.cluster.flops_per_s.resize(N);
  d.cluster.links.assign(N, std::vector<placement::Link>(N));
  for (int i = 0; i < N; ++i) {
    d.cluster.flops_per_s[i] = (cands[i].gflops > 0 ? cands[i].gflops : fill) * 1e9 * kComputeEfficiency;
  }
  for (int i = 0; i < N && K > 1; ++i) {
    for (int j = 0; j < N; ++j) {
      if (i == j) continue;
      // One direction stands in for the other until both are measured.
      const v1::LinkMeasurement* m = link(i, j);
      if (m == nullptr) m = link(j, i);
      if (m == nullptr) {
        d.how = absl::StrCat("naive order: no link measurement between ", cands[i].name, " and ", cands[j].name, " yet");
        return d;
      }
      d.cluster.links[i][j] = EffectiveLink(m->rtt_ms(), m->mbit_per_s(), spec.links(), cands[i].region, cands[j].region);
    }
  }
  d.modelled = true;
  const absl::Time t0 = absl::Now();
  const placement::Solution best = d.counts.empty() ? placement::Solve(d.job, d.cluster, solve)
                                                    : placement::SolveCounts(d.job, d.counts, d.cluster, solve);
  d.solve_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  d.naive_cost = d.counts.empty() ? placement::Evaluate(d.job, d.cluster, d.naive)
                                  : placement::EvaluateCounts(d.job, d.counts, d.cluster, d.naive);
  if (!best.placement.empty() && best.cost.step_s < d.naive_cost.step_s * (1 - min_gain)) {
    d.chosen = best.placement;
    d.chosen_cost = best.cost;
    d.how = absl::StrCat("bandwidth-aware: ", best.method);
  } else {
    d.chosen_cost = d.naive_cost;
    d.how = absl::StrCat("naive order: no placement predicted more than ", std::lround(min_gain * 100),
                         "% faster (", best.method, ")");
  }
  return d;
}

// What limits replica r's pipeline (placement.h's layout: slot r * S + s).
std::string PipelineLimit(const Decision& d, const std::vector<Candidate>& cands) {
  const placement::Cost& c = d.chosen_cost;
  const int S = d.job.stages, s = c.limit_stage;
  const auto& who = [&](int stage) -> const std::string& { return cands[d.chosen[c.limit_replica * S + stage]].name; };
  switch (c.limit) {
    case placement::Cost::Limit::kCompute:
      return absl::StrCat("stage ", s, "'s compute on ", who(s));
    case placement::Cost::Limit::kLinkForward:
      return absl::StrCat("activations on the link ", who(s), " -> ", who(s + 1), " (stage ", s, " to ", s + 1, ")");
    case placement::Cost::Limit::kLinkBackward:
      return absl::StrCat("gradients on the link ", who(s + 1), " -> ", who(s), " (stage ", s + 1, " to ", s, ")");
  }
  return "";
}

// What limits a job with differing replica counts (placement_counts.h): a slot's compute, or what it
// sends to the next or previous stage (one of whose replicas receives it).
std::string SlotLimit(const Decision& d, const std::vector<Candidate>& cands) {
  const placement::Cost& c = d.chosen_cost;
  const int s = c.limit_stage;
  const std::string& at = cands[d.chosen[SlotOf(d.counts, s, c.limit_replica)]].name;
  const std::string slot = absl::StrCat("stage ", s, " replica ", c.limit_replica);
  switch (c.limit) {
    case placement::Cost::Limit::kCompute:
      return absl::StrCat(slot, "'s compute on ", at);
    case placement::Cost::Limit::kLinkForward:
      return absl::StrCat("activations from ", at, " (", slot, ") to stage ", s + 1);
    case placement::Cost::Limit::kLinkBackward:
      return absl::StrCat("gradients from ", at, " (", slot, ") to stage ", s - 1);
  }
  return "";
}

std::string DescribeLimit(const Decision& d, const std::vector<Candidate>& cands) {
  const placement::Cost& c = d.chosen_cost;
  std::string out = d.counts.empty() ? PipelineLimit(d, cands) : SlotLimit(d, cands);
  absl::StrAppend(&out, ": ", Ms(c.period_s), " per micro-batch; fill and drain ", Ms(c.fill_drain_s));
  if (c.dp_s > 0) absl::StrAppend(&out, "; data-parallel sync ", Ms(c.dp_s));
  return out;
}

}  // namespace

void CoordinatorService::OnLinkReport(const Worker& w, const v1::LinkReport& r) {
  const uint64_t from = w.status.worker_id(), to = r.to_worker_id();
  if (to == from || workers_.find(to) == workers_.end()) return;
  v1::LinkMeasurement& m = links_[{from, to}];
  m.set_from_worker_id(from);
  m.set_to_worker_id(to);
  if (r.error().empty()) {
    m.set_rtt_ms(r.rtt_ms());
    m.set_mbit_per_s(r.mbit_per_s());
    m.set_bytes(r.bytes());
    m.set_measured_unix(UnixNow());
    m.clear_error();
  } else {
    m.set_error(r.error());
  }
  if (absl::Status s = store_->PutLink(m); !s.ok()) common::Log("coordinator", absl::StrCat("cannot persist link: ", s.message()));
}

void CoordinatorService::SendProbePeers(Outbox* out) {
  if (stopping_) return;
  for (const auto& [id, w] : workers_) {
    if (!w.session || w.status.state() == v1::WORKER_STATE_DEAD || w.status.info().probe_address().empty()) continue;
    v1::CoordinatorMessage m;
    v1::ProbePeers* peers = m.mutable_probe_peers();
    for (const auto& [pid, p] : workers_) {
      if (pid == id || p.status.state() == v1::WORKER_STATE_DEAD || p.status.info().probe_address().empty()) continue;
      v1::ProbePeer* peer = peers->add_peers();
      peer->set_worker_id(pid);
      peer->set_name(p.status.info().name());
      peer->set_probe_address(p.status.info().probe_address());
    }
    out->emplace_back(w.session, std::move(m));
  }
}

std::vector<uint64_t> CoordinatorService::Place(Job& job, std::vector<uint64_t>* free) {
  const v1::JobSpec& spec = job.status.spec();
  std::vector<Candidate> cands;
  for (uint64_t id : *free) {
    const v1::WorkerStatus& s = workers_.at(id).status;
    cands.push_back({id, s.info().name(), s.info().region(), s.info().compute_gflops()});
  }
  auto link = [&](int i, int j) -> const v1::LinkMeasurement* {
    auto it = links_.find({cands[i].id, cands[j].id});
    return it == links_.end() || it->second.measured_unix() <= 0 ? nullptr : &it->second;
  };
  const Decision d = Decide(spec, cands, link, opt_.placement.min_gain, opt_.placement.solve);
  std::vector<uint64_t> chosen;
  for (int i : d.chosen) chosen.push_back(cands[i].id);
  free->erase(std::remove_if(free->begin(), free->end(),
                             [&](uint64_t id) { return std::find(chosen.begin(), chosen.end(), id) != chosen.end(); }),
              free->end());
  job.status.set_placement(d.how);
  job.status.set_predicted_step_seconds(d.modelled ? d.chosen_cost.step_s : 0);
  job.status.set_naive_step_seconds(d.modelled ? d.naive_cost.step_s : 0);
  std::string names;
  for (int i : d.chosen) absl::StrAppend(&names, names.empty() ? "" : ", ", cands[i].name);
  common::Log("coordinator",
              absl::StrCat("job ", job.status.job_id(), " on ", names, ": ", d.how,
                           d.modelled ? absl::StrFormat("; predicted step %.3g s, naive order %.3g s (solved in %.3g s)",
                                                        d.chosen_cost.step_s, d.naive_cost.step_s, d.solve_seconds)
                                      : ""));
  return chosen;
}

grpc::Status CoordinatorService::ListLinks(grpc::ServerContext* ctx, const v1::ListLinksRequest*, v1::ListLinksResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "ListLinks"); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  const double now = UnixNow();
  auto live = [&](uint64_t id) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    auto it = workers_.find(id);
    return it != workers_.end() && it->second.status.state() != v1::WORKER_STATE_DEAD;
  };
  for (const auto& [id, w] : workers_) {
    if (live(id)) *resp->add_workers() = w.status;
  }
  for (const auto& [key, m] : links_) {
    if (!live(key.first) || !live(key.second)) continue;
    v1::LinkMeasurement* out = resp->add_links();
    *out = m;
    if (m.measured_unix() > 0) out->set_age_seconds(std::max(0.0, now - m.measured_unix()));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::PlanJob(grpc::ServerContext* ctx, const v1::PlanJobRequest* req, v1::PlanJobResponse* resp) {
  security::Identity who;
  if (grpc::Status s = Authorize(ctx, Access::kRead, &who, "PlanJob"); !s.ok()) return s;
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(req->spec_yaml());
  if (!spec.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(spec.status().message()));
  absl::StatusOr<std::vector<stage_runtime::LayerRange>> parts =
      stage_runtime::PartitionLayers(spec->model().layers(), spec->stages());
  if (!parts.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(parts.status().message()));
  absl::MutexLock l(&mu_);
  std::vector<Candidate> idle, live;
  for (const auto& [id, w] : workers_) {
    if (w.status.state() == v1::WORKER_STATE_DEAD) continue;
    const Candidate c{id, w.status.info().name(), w.status.info().region(), w.status.info().compute_gflops()};
    live.push_back(c);
    if (w.status.state() == v1::WORKER_STATE_IDLE && w.session) idle.push_back(c);
  }
  const int K = WorkersNeeded(*spec);
  std::string note;
  std::vector<Candidate> cands;
  if (static_cast<int>(idle.size()) >= K) {
    cands = idle;
    note = absl::StrCat("candidates: the ", idle.size(), " idle worker(s)");
  } else if (static_cast<int>(live.size()) >= K) {
    cands = live;
    note = absl::StrCat("only ", idle.size(), " idle: planned over all ", live.size(), " live workers as if they were idle");
  } else {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the job needs ", K, " workers, only ", live.size(), " live"));
  }
  auto link = [&](int i, int j) ABSL_SHARED_LOCKS_REQUIRED(mu_) -> const v1::LinkMeasurement* {
    auto it = links_.find({cands[i].id, cands[j].id});
    return it == links_.end() || it->second.measured_unix() <= 0 ? nullptr : &it->second;
  };
  const Decision d = Decide(*spec, cands, link, opt_.placement.min_gain, opt_.placement.solve);
  auto fill = [&](const placement::Placement& p, google::protobuf::RepeatedPtrField<v1::PlannedStage>* out)
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    // Every slot in order (proto/replica_layout.h, as JobStatus.stages), each with its link to the
    // slowest of the next stage's replicas it exchanges micro-batches with (SlotCosts: with one
    // replica count for every stage, the same replica's, the next slot). SlotCosts takes the whole
    // step's micro-batches, which d.job holds only where the counts differ.
    const int S = spec->stages();
    const std::vector<ReplicaSlot> slots = ReplicaSlots(*spec);
    std::vector<placement::SlotCost> slot_costs;
    if (d.modelled) {
      placement::JobShape step = d.job;
      step.micro_batches = spec->micro_batches();
      slot_costs = placement::SlotCosts(step, ReplicaCounts(*spec), d.cluster, p);
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      const int s = slots[k].stage, r = slots[k].replica, i = p[k];
      v1::PlannedStage* ps = out->Add();
      const Candidate& c = cands[i];
      ps->set_stage(s);
      ps->set_replica(r);
      ps->set_worker_id(c.id);
      ps->set_worker_name(c.name);
      ps->set_region(c.region);
      ps->set_layer_begin((*parts)[s].begin);
      ps->set_layer_end((*parts)[s].end);
      if (!d.modelled) continue;
      const placement::StageCost& cost = slot_costs[k].cost;
      const int next = slot_costs[k].next;  // the slot the link's figures are to
      ps->set_compute_seconds(cost.compute_s);
      if (s + 1 == S) continue;
      ps->set_forward_seconds(cost.forward_s);
      ps->set_backward_seconds(cost.backward_s);
      const v1::LinkMeasurement* m = link(i, p[next]);
      if (m == nullptr) m = link(p[next], i);
      if (m != nullptr) {
        ps->set_mbit_per_s(m->mbit_per_s());
        ps->set_rtt_ms(m->rtt_ms());
      }
    }
  };
  fill(d.chosen, resp->mutable_stages());
  fill(d.naive, resp->mutable_naive_stages());
  resp->set_placement(d.how);
  if (d.modelled) {
    resp->set_predicted_step_seconds(d.chosen_cost.step_s);
    resp->set_naive_step_seconds(d.naive_cost.step_s);
    resp->set_bottleneck(DescribeLimit(d, cands));
  }
  if (!d.note.empty()) absl::StrAppend(&note, "; ", d.note);
  resp->set_note(note);
  resp->set_solve_seconds(d.solve_seconds);
  return grpc::Status::OK;
}

}  // namespace longhaul::coordinator
