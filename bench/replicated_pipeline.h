// ReplicatedPipeline: replicated stages in one process, for the benchmarks (longhaul-bench
// convergence --replicas, sweep --data-parallel; docs/replicated-stages.md). N replicas of an
// S-stage pipeline, each with its own executors, in-process links and step loops (as
// stage_runtime::InProcessPipeline builds them); every stage's N replicas synchronise after the
// backward pass with the workers' own worker::ReplicaSync over collective::InProcessHub transports
// instead of gRPC: the same collective algorithms, codecs and sharded optimizer, only the bytes'
// carrier differs. Replica r takes micro-batches r*M/N .. (r+1)*M/N-1 of the step, as a job's
// replicas do, so the global batch does not change with N.
//
// Threading: the methods from one thread; TrainStep runs one thread per replica and stage.
#ifndef LONGHAUL_BENCH_REPLICATED_PIPELINE_H_
#define LONGHAUL_BENCH_REPLICATED_PIPELINE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collective/in_process_transport.h"
#include "netem/shaper.h"
#include "stage_runtime/in_process_link.h"
#include "stage_runtime/stage_loop.h"
#include "worker/replica_sync.h"

namespace longhaul::bench {

// N replicas of an S-stage pipeline in one process: each replica its own executors, links and
// step loops (as InProcessPipeline builds them), each stage's replicas joined by a ReplicaSync.
class ReplicatedPipeline {
 public:
  // `o.micro_batches` is the step's (all replicas'); each replica runs o.micro_batches / replicas.
  // `regions`: replica r lives in region r % regions (the two-level collectives' topology).
  // `between_regions`: every directed link between replicas of different regions (one token bucket
  // per pair, as longhaul-netem's between_regions); links within a region and the pipeline's are
  // not shaped.
  static absl::StatusOr<std::unique_ptr<ReplicatedPipeline>> Create(stage_runtime::PipelineOptions o, int replicas,
                                                                    collective::DpCodec codec, int regions,
                                                                    int weight_bits,
                                                                    netem::LinkProfile between_regions = {}) {
    absl::StatusOr<std::vector<stage_runtime::LayerRange>> parts = stage_runtime::PartitionLayers(o.model.layers, o.stages);
    if (!parts.ok()) return parts.status();
    if (replicas < 2 || o.micro_batches % replicas != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batches (", o.micro_batches, ") must be a multiple of the replicas (", replicas, "), replicas >= 2"));
    }
    std::unique_ptr<ReplicatedPipeline> p(new ReplicatedPipeline());
    o.micro_batches /= replicas;  // each replica's share
    p->opt_ = o;
    auto fc = codec::MakeCodec(o.forward_codec);
    if (!fc.ok()) return fc.status();
    auto bc = codec::MakeCodec(o.backward_codec);
    if (!bc.ok()) return bc.status();
    p->fwd_codec_ = std::move(*fc);
    p->bwd_codec_ = std::move(*bc);
    const int S = o.stages;
    p->rep_.resize(static_cast<size_t>(replicas));
    for (Replica& r : p->rep_) {
      for (int s = 0; s < S; ++s) {
        stage_runtime::StageSpec spec{o.model, (*parts)[s], s == 0, s == S - 1, o.seed, o.micro_batches, o.optimizer,
                                      o.device, o.precision};
        auto e = stage_runtime::StageExecutor::Create(spec);  // same seed: identical replicas
        if (!e.ok()) return e.status();
        r.stages.push_back(std::move(*e));
      }
      for (int s = 0; s + 1 < S; ++s) {
        r.links.push_back(stage_runtime::InProcessLink::Pair(s, p->fwd_codec_.get(), p->bwd_codec_.get(),
                                                             stage_runtime::LinkCapacity(o), o.codec_threads));
      }
      for (int s = 0; s < S; ++s) {
        stage_runtime::Link* prev = s > 0 ? r.links[s - 1].second.get() : nullptr;
        stage_runtime::Link* next = s + 1 < S ? r.links[s].first.get() : nullptr;
        r.loops.push_back(std::make_unique<stage_runtime::StageLoop>(o, s, r.stages[s].get(), prev, next));
      }
    }
    std::vector<std::string> region_names;
    regions = std::max(1, regions);
    for (int r = 0; r < replicas; ++r) region_names.push_back(absl::StrCat("region-", r % regions));
    collective::InProcessHubOptions shaped;
    if (between_regions.shaped()) {
      shaped.link = [between_regions, regions](int from, int to) {
        return from % regions == to % regions ? netem::LinkProfile{} : between_regions;
      };
    }
    for (int s = 0; s < S; ++s) {
      // One hub per group, as the worker has one gRPC group for the gradients and one for scalars
      // (the scalars, a few bytes, unshaped as there).
      p->hubs_.push_back(std::make_unique<collective::InProcessHub>(replicas, shaped));
      p->hubs_.push_back(std::make_unique<collective::InProcessHub>(replicas));
      collective::InProcessHub& dp = *p->hubs_[p->hubs_.size() - 2];
      collective::InProcessHub& scalars = *p->hubs_.back();
      for (int r = 0; r < replicas; ++r) {
        worker::ReplicaSyncOptions ro;
        ro.group = absl::StrCat("stage-", s);
        ro.rank = r;
        ro.regions = region_names;
        ro.codec = codec;
        ro.weight_bits = weight_bits;
        ro.seed = o.seed * 1000 + static_cast<uint64_t>(s);  // the worker's (stage_runner.cc)
        auto rs = worker::ReplicaSync::CreateOver(dp.Connect(r), scalars.Connect(r), ro, p->rep_[r].stages[s].get(),
                                                  o.optimizer);
        if (!rs.ok()) return rs.status();
        p->rep_[r].syncs.push_back(std::move(*rs));
        p->rep_[r].loops[s]->SetGradientSync(p->rep_[r].syncs.back().get());
      }
    }
    return p;
  }

  // One step over all replicas' micro-batches (replica r takes its consecutive share).
  absl::StatusOr<stage_runtime::StepResult> TrainStep(const std::vector<stage_runtime::Batch>& mbs) {
    if (!failed_.ok()) return failed_;
    const int R = static_cast<int>(rep_.size()), S = opt_.stages, m = opt_.micro_batches;
    if (static_cast<int>(mbs.size()) != R * m) return absl::InvalidArgumentError("wrong number of micro-batches");
    std::vector<absl::StatusOr<stage_runtime::StepResult>> results(static_cast<size_t>(R * S),
                                                                   absl::UnknownError("not run"));
    absl::Mutex mu;
    absl::Status first_error;
    std::vector<std::thread> threads;
    const absl::Time started = absl::Now();
    for (int r = 0; r < R; ++r) {
      for (int s = 0; s < S; ++s) {
        threads.emplace_back([&, r, s] {
          const std::vector<stage_runtime::Batch> mine(mbs.begin() + r * m, mbs.begin() + (r + 1) * m);
          auto& out = results[static_cast<size_t>(r * S + s)];
          out = rep_[r].loops[s]->Step(mine);
          if (out.ok()) return;
          {
            absl::MutexLock l(&mu);
            if (!first_error.ok()) return;
            first_error = absl::Status(out.status().code(),
                                       absl::StrCat("replica ", r, " stage ", s, ": ", out.status().message()));
          }
          for (Replica& x : rep_) {
            for (auto& loop : x.loops) loop->Cancel(first_error);
          }
        });
      }
    }
    for (std::thread& t : threads) t.join();
    if (!first_error.ok()) return failed_ = first_error;
    last_dp_ = collective::CallStats();
    last_stage_dp_.assign(static_cast<size_t>(S), StageDp());
    for (Replica& x : rep_) {
      for (size_t s = 0; s < x.syncs.size(); ++s) {
        const collective::CallStats& c = x.syncs[s]->last();
        last_dp_.Add(c);
        StageDp& d = last_stage_dp_[s];
        if (c.wall >= d.wall) d.update = c.update;  // the slowest replica's
        d.wall = std::max(d.wall, c.wall);
        d.busiest_link = std::max(d.busiest_link, c.busiest_inter_region_link());
        d.replicas.push_back({c.start - started, c.wall, c.busiest_inter_region_link()});
      }
    }
    return *results[static_cast<size_t>(S - 1)];  // replica 0's last stage: the replicas' mean loss
  }

  // Replica 0's model (the replicas' agree, bit for bit for every codec here) through the forward
  // codec, as InProcessPipeline::EvalLoss.
  absl::StatusOr<double> EvalLoss(const std::vector<stage_runtime::Batch>& batches) {
    double sum = 0;
    const int S = opt_.stages;
    for (const stage_runtime::Batch& b : batches) {
      torch::Tensor x = b.tokens;
      for (int s = 0; s < S; ++s) {
        auto y = rep_[0].stages[s]->Evaluate(x, s == S - 1 ? b.labels : torch::Tensor());
        if (!y.ok()) return y.status();
        x = *y;
        if (s < S - 1) {
          codec::EncodeOptions eo;
          eo.threads = opt_.codec_threads;
          eo.seed = static_cast<uint64_t>(rep_[0].stages[0]->step());
          auto t = stage_runtime::CodecRoundTrip(*fwd_codec_, x, eo, /*measure_error=*/false, /*stats=*/nullptr);
          if (!t.ok()) return t.status();
          x = *t;
        }
      }
      sum += x.item<double>();
    }
    return batches.empty() ? 0.0 : sum / static_cast<double>(batches.size());
  }

  // Every replica's and stage's data-parallel calls in the last step (gradients and weights).
  const collective::CallStats& last_dp() const { return last_dp_; }
  // Per stage, the last step's data-parallel sync: the slowest replica's wall time (from the end of
  // its backward pass, so it includes waiting for the other replicas and, through the clipping norm,
  // for the other stages) and the most bytes one replica sent to one replica in another region (each
  // directed link between regions is shaped on its own: a replica's messages to two such peers may
  // overlap, as BitDP's bit planes and fp32 ring do).
  // Each replica's (index: replica): from the step's start to its sync's start (the end of its
  // backward pass; it cannot send a byte before), its sync's wall time and its busiest link's bytes.
  struct ReplicaDp {
    absl::Duration start, wall;
    int64_t busiest_link = 0;
  };
  struct StageDp {
    absl::Duration wall = absl::ZeroDuration();
    absl::Duration update = absl::ZeroDuration();  // of that wall, the slowest replica's update
    int64_t busiest_link = 0;
    std::vector<ReplicaDp> replicas;
  };
  const std::vector<StageDp>& last_stage_dp() const { return last_stage_dp_; }
  absl::Duration last_dp_wall() const {  // the slowest replica's of any stage
    absl::Duration w = absl::ZeroDuration();
    for (const StageDp& s : last_stage_dp_) w = std::max(w, s.wall);
    return w;
  }
  std::vector<stage_runtime::LinkStats> forward_links() const {
    std::vector<stage_runtime::LinkStats> v;
    for (const Replica& r : rep_) {
      for (const auto& l : r.links) v.push_back(l.first->stats());
    }
    return v;
  }

 private:
  struct Replica {
    std::vector<std::unique_ptr<stage_runtime::StageExecutor>> stages;
    std::vector<std::pair<std::unique_ptr<stage_runtime::InProcessLink>, std::unique_ptr<stage_runtime::InProcessLink>>>
        links;
    std::vector<std::unique_ptr<stage_runtime::StageLoop>> loops;
    std::vector<std::unique_ptr<worker::ReplicaSync>> syncs;  // one per stage; before the hubs go
  };
  ReplicatedPipeline() = default;

  stage_runtime::PipelineOptions opt_;  // one replica's (micro_batches: its share)
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  std::vector<std::unique_ptr<collective::InProcessHub>> hubs_;  // outlive the transports (rep_)
  std::vector<Replica> rep_;
  collective::CallStats last_dp_;
  std::vector<StageDp> last_stage_dp_;
  absl::Status failed_;
};

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_REPLICATED_PIPELINE_H_
