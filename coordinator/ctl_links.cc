#include "coordinator/ctl_links.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "coordinator/ctl_channel.h"
#include "coordinator/job_spec.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/read_file.h"
#include "proto/link_spec.h"
#include "coordinator/ctl_plan_sim.h"
#include "longhaul/v1/control_plane.grpc.pb.h"
#include "proto/channel_config.h"

namespace longhaul::coordinator {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "longhaulctl: %s\n", msg.c_str());
  return 1;
}

int RpcFail(const std::string& what, const grpc::Status& s, const std::string& addr) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail(absl::StrCat(what, ": coordinator at ", addr, " is not reachable (", s.error_message(), ")"));
  }
  return Fail(absl::StrCat(what, ": ", s.error_message()));
}

std::unique_ptr<v1::Coordinator::Stub> Stub(const std::string& addr) {
  return v1::Coordinator::NewStub(CoordinatorChannel(addr));
}

void Deadline(grpc::ClientContext* c, double seconds) {
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(seconds)));
}

std::string Age(double s) {
  if (s < 120) return absl::StrFormat("%.0fs", s);
  if (s < 7200) return absl::StrFormat("%.0fm%02.0fs", std::floor(s / 60), std::fmod(s, 60));
  return absl::StrFormat("%.1fh", s / 3600);
}

std::string Ms(double s) { return absl::StrFormat("%.3g ms", s * 1e3); }

}  // namespace

CLI::App* AddLinksCommand(CLI::App& app, LinksFlags* flags) {
  CLI::App* cmd = app.add_subcommand(
      "links", "the measured links between live workers (Mbit/s, RTT, age of the measurement) and\n"
               "each worker's compute speed, as the placement sees them");
  cmd->add_flag("--json", flags->json, "machine-readable output");
  return cmd;
}

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* flags) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "where the job would be placed now, its predicted step time and the naive order's;\n"
              "starts nothing");
  cmd->add_option("spec", flags->spec, "the job spec")->type_name("JOB.yaml")->required();
  cmd->add_flag("--json", flags->json, "machine-readable output");
  AddPlanSimulationFlags(cmd, flags);
  return cmd;
}

int RunLinks(const std::string& coordinator, const LinksFlags& flags) {
  v1::ListLinksResponse r;
  grpc::ClientContext ctx;
  Deadline(&ctx, 10);
  grpc::Status s = Stub(coordinator)->ListLinks(&ctx, {}, &r);
  if (!s.ok()) return RpcFail("links", s, coordinator);
  std::map<uint64_t, const v1::WorkerStatus*> by_id;
  for (const v1::WorkerStatus& w : r.workers()) by_id[w.worker_id()] = &w;
  std::map<std::pair<uint64_t, uint64_t>, const v1::LinkMeasurement*> link;
  for (const v1::LinkMeasurement& m : r.links()) link[{m.from_worker_id(), m.to_worker_id()}] = &m;
  if (flags.json) {
    nlohmann::json out = {{"workers", nlohmann::json::array()}, {"links", nlohmann::json::array()}};
    for (const auto& [id, w] : by_id) {
      out["workers"].push_back({{"id", id}, {"name", w->info().name()}, {"region", w->info().region()},
                                {"compute_gflops", w->info().compute_gflops()},
                                {"probe_address", w->info().probe_address()}});
    }
    for (const auto& [from, fw] : by_id) {
      for (const auto& [to, tw] : by_id) {
        if (from == to) continue;
        auto it = link.find({from, to});
        const v1::LinkMeasurement* m = it == link.end() ? nullptr : it->second;
        const bool measured = m != nullptr && m->measured_unix() > 0;
        out["links"].push_back({{"from", fw->info().name()}, {"to", tw->info().name()}, {"measured", measured},
                                {"mbit_per_s", measured ? m->mbit_per_s() : 0.0},
                                {"rtt_ms", measured ? m->rtt_ms() : 0.0},
                                {"age_seconds", measured ? m->age_seconds() : 0.0},
                                {"bytes", measured ? m->bytes() : 0}, {"error", m ? m->error() : ""}});
      }
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-16s %-10s %-9s %s\n", "WORKER", "REGION", "GFLOP/S", "PROBE ADDRESS");
  for (const auto& [id, w] : by_id) {
    std::printf("%-16s %-10s %-9s %s\n", w->info().name().c_str(), w->info().region().c_str(),
                w->info().compute_gflops() > 0 ? absl::StrFormat("%.1f", w->info().compute_gflops()).c_str() : "-",
                w->info().probe_address().empty() ? "- (not probing)" : w->info().probe_address().c_str());
  }
  std::printf("\n%-16s %-16s %-10s %-11s %-8s %s\n", "FROM", "TO", "MBIT/S", "RTT", "AGE", "NOTE");
  int pairs = 0, measured = 0;
  for (const auto& [from, fw] : by_id) {
    for (const auto& [to, tw] : by_id) {
      if (from == to) continue;
      ++pairs;
      auto it = link.find({from, to});
      const v1::LinkMeasurement* m = it == link.end() ? nullptr : it->second;
      std::string note;
      if (m != nullptr && !m->error().empty()) note = absl::StrCat("last probe failed: ", m->error());
      if (m == nullptr || m->measured_unix() <= 0) {
        std::printf("%-16s %-16s %-10s %-11s %-8s %s\n", fw->info().name().c_str(), tw->info().name().c_str(), "-", "-",
                    "-", note.empty() ? "not measured yet" : note.c_str());
        continue;
      }
      ++measured;
      std::printf("%-16s %-16s %-10.1f %-11s %-8s %s\n", fw->info().name().c_str(), tw->info().name().c_str(),
                  m->mbit_per_s(), absl::StrFormat("%.3f ms", m->rtt_ms()).c_str(), Age(m->age_seconds()).c_str(),
                  note.c_str());
    }
  }
  std::printf("\n%zu live worker(s): %d of %d directed links measured\n", by_id.size(), measured, pairs);
  return 0;
}

int RunPlan(const std::string& coordinator, const PlanFlags& flags) {
  if (flags.simulate) return RunPlanSimulation(flags);
  absl::StatusOr<std::string> yaml = common::ReadFile(flags.spec);
  if (!yaml.ok()) return Fail(std::string(yaml.status().message()));
  v1::PlanJobRequest req;
  req.set_spec_yaml(*yaml);
  v1::PlanJobResponse r;
  grpc::ClientContext ctx;
  Deadline(&ctx, 60);
  grpc::Status s = Stub(coordinator)->PlanJob(&ctx, req, &r);
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    std::fprintf(stderr, "longhaulctl: %s was rejected:\n", flags.spec.c_str());
    std::istringstream lines(s.error_message());
    for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "  - %s\n", line.c_str());
    return 1;
  }
  if (!s.ok()) return RpcFail("plan", s, coordinator);
  auto names = [](const auto& stages) {
    std::string out;
    for (const v1::PlannedStage& p : stages) absl::StrAppend(&out, out.empty() ? "" : ", ", p.worker_name());
    return out;
  };
  if (flags.json) {
    auto stages = [](const auto& in) {
      nlohmann::json out = nlohmann::json::array();
      for (const v1::PlannedStage& p : in) {
        out.push_back({{"stage", p.stage()}, {"replica", p.replica()}, {"worker", p.worker_name()}, {"region", p.region()},
                       {"layers", {p.layer_begin(), p.layer_end()}}, {"compute_seconds", p.compute_seconds()},
                       {"forward_seconds", p.forward_seconds()}, {"backward_seconds", p.backward_seconds()},
                       {"mbit_per_s", p.mbit_per_s()}, {"rtt_ms", p.rtt_ms()}});
      }
      return out;
    };
    nlohmann::json out = {{"placement", r.placement()},
                          {"predicted_step_seconds", r.predicted_step_seconds()},
                          {"naive_step_seconds", r.naive_step_seconds()},
                          {"bottleneck", r.bottleneck()},
                          {"note", r.note()},
                          {"solve_seconds", r.solve_seconds()},
                          {"stages", stages(r.stages())},
                          {"naive_stages", stages(r.naive_stages())}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const bool modelled = r.predicted_step_seconds() > 0;
  // The coordinator accepted the spec, so it parses here too: the links' emulated rates.
  const absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(*yaml);
  std::printf("placement: %s\n", r.placement().c_str());
  int last_layer = 0;  // the last stage's end: every other stage has a link to the next
  for (const v1::PlannedStage& p : r.stages()) last_layer = std::max(last_layer, p.layer_end());
  const bool replicated = std::any_of(r.stages().begin(), r.stages().end(),
                                      [](const v1::PlannedStage& p) { return p.replica() > 0; });
  // Replica counts that differ between stages: slots, not pipelines; each slot's link figures are
  // the slowest of those to the next stage's replicas it streams to (SlotCosts), which the response
  // does not name, so no emulated rate is shown for them.
  const bool by_counts = spec.ok() && ReplicaCountsDiffer(*spec);
  for (int i = 0; i < r.stages_size(); ++i) {
    const v1::PlannedStage& p = r.stages(i);
    const std::string where = p.region().empty() ? "" : absl::StrCat(" (", p.region(), ")");
    std::string indent = "  ";
    if (by_counts) {
      std::printf("  stage %d replica %d: %s%s, layers %d..%d", p.stage(), p.replica(), p.worker_name().c_str(),
                  where.c_str(), p.layer_begin(), p.layer_end() - 1);
    } else {
      if (replicated && p.stage() == 0) std::printf("  replica %d:\n", p.replica());
      if (replicated) indent = "    ";
      std::printf("%sstage %d: %s%s, layers %d..%d", indent.c_str(), p.stage(), p.worker_name().c_str(), where.c_str(),
                  p.layer_begin(), p.layer_end() - 1);
    }
    if (modelled) std::printf(", compute %s per micro-batch", Ms(p.compute_seconds()).c_str());
    std::printf("\n");
    // (With equal counts the next slot is the next stage of the same replica.)
    if (!modelled || p.layer_end() >= last_layer || (!by_counts && i + 1 >= r.stages_size())) continue;
    std::string to = absl::StrCat("stage ", p.stage() + 1);
    double emulated = 0;
    if (by_counts) {
      const size_t fan = ExchangingReplicas(*spec, p.stage(), p.replica(), p.stage() + 1).size();
      if (fan > 1) absl::StrAppend(&to, " (the slowest of ", fan, ")");
    } else if (spec.ok()) {
      emulated = LinkSpecBetween(spec->links(), p.region(), r.stages(i + 1).region()).rate_mbit();
    }
    std::printf("%s    link to %s: %.1f Mbit/s%s, RTT %.3f ms; activations %s, gradients %s per micro-batch\n",
                indent.c_str(), to.c_str(), p.mbit_per_s(),
                emulated > 0 ? absl::StrFormat(" measured, emulated at %g", emulated).c_str() : "", p.rtt_ms(),
                Ms(p.forward_seconds()).c_str(), Ms(p.backward_seconds()).c_str());
  }
  if (modelled) {
    std::printf("predicted step time: %.3f s\n", r.predicted_step_seconds());
    std::printf("  limited by %s\n", r.bottleneck().c_str());
    std::printf("naive order (%s): %.3f s predicted (%.2fx the chosen placement's)\n", names(r.naive_stages()).c_str(),
                r.naive_step_seconds(), r.naive_step_seconds() / r.predicted_step_seconds());
    std::printf("solved in %.3f s\n", r.solve_seconds());
  } else {
    std::printf("no prediction: the naive order (%s) would be used\n", names(r.naive_stages()).c_str());
  }
  if (!r.note().empty()) std::printf("note: %s\n", r.note().c_str());
  std::printf("nothing was started\n");
  return 0;
}

}  // namespace longhaul::coordinator
