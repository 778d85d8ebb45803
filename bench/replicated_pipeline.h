// ReplicatedPipeline: replicated stages in one process, for the benchmarks (longhaul-bench
// convergence --replicas, sweep --data-parallel; docs/replicated-stages.md). Stage s runs on N_s
// replicas (counts[s]; the same layout as a job's, common/replica_counts.h), each with its own
// executor and step loop; replica r takes micro-batches r*M/N_s .. (r+1)*M/N_s-1 of the step, so
// the global batch does not depend on the counts, and its in-process links (as
// stage_runtime::InProcessPipeline builds them) go to the replicas of the neighbouring stages that
// take the same micro-batches, as a LinkFan where the counts differ. The replicas of every stage
// that has several synchronise after the backward pass with the workers' own worker::ReplicaSync over
// collective::InProcessHub transports instead of gRPC: the same collective algorithms, codecs and
// sharded optimizer, only the bytes' carrier differs.
//
// Threading: the methods from one thread; TrainStep runs one thread per stage replica.
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
#include "common/replica_counts.h"
#include "netem/shaper.h"
#include "stage_runtime/in_process_link.h"
#include "stage_runtime/stage_loop.h"
#include "worker/replica_sync.h"

namespace longhaul::bench {

// A benchmark flag's replica counts (`--replicas 2` or `2,1`) as one count per stage: one value
// for every stage, or one per stage, each in [1, kMaxReplicas] and dividing the step's
// `micro_batches`. The error names no flag.
inline absl::StatusOr<std::vector<int>> CountsPerStage(const std::vector<int>& given, int stages, int64_t micro_batches) {
  if (given.size() != 1 && given.size() != static_cast<size_t>(stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat(given.size(), " counts for ", stages, " stages (one for every stage, or one each)"));
  }
  for (int n : given) {
    if (n < 1 || n > kMaxReplicas) {
      return absl::InvalidArgumentError(absl::StrCat("every count must be in [1, ", kMaxReplicas, "], not ", n));
    }
    if (micro_batches % n != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the micro-batches (", micro_batches, ") must be a multiple of every count, not of ", n));
    }
  }
  return given.size() == 1 ? std::vector<int>(static_cast<size_t>(stages), given[0]) : given;
}

// Stage s on counts[s] replicas in one process, each with its own executor and step loop; the
// replicas of a stage with more than one are joined by a ReplicaSync.
class ReplicatedPipeline {
 public:
  // `o.micro_batches` is the step's (all replicas'); replica r of stage s runs its share
  // o.micro_batches / counts[s] (every count must divide it; at least one count above 1).
  // `regions`: replica r of a stage lives in region r % regions (the two-level collectives'
  // topology). `between_regions`: every directed link between replicas of different regions (one
  // token bucket per pair, as longhaul-netem's between_regions); links within a region and the
  // pipeline's are not shaped.
  static absl::StatusOr<std::unique_ptr<ReplicatedPipeline>> Create(stage_runtime::PipelineOptions o,
                                                                    std::vector<int> counts, collective::DpCodec codec,
                                                                    int regions, int weight_bits,
                                                                    netem::LinkProfile between_regions = {}) {
    absl::StatusOr<std::vector<stage_runtime::LayerRange>> parts = stage_runtime::PartitionLayers(o.model.layers, o.stages);
    if (!parts.ok()) return parts.status();
    const int S = o.stages, M = o.micro_batches;
    if (static_cast<int>(counts.size()) != S) {
      return absl::InvalidArgumentError(absl::StrCat(counts.size(), " replica counts for ", S, " stages"));
    }
    if (*std::max_element(counts.begin(), counts.end()) < 2) {
      return absl::InvalidArgumentError("no stage has more than one replica");
    }
    for (int s = 0; s < S; ++s) {
      if (counts[s] < 1 || M % counts[s] != 0) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batches (", M, ") must be a multiple of stage ", s,
                                                       "'s replicas (", counts[s], "), replicas >= 1"));
      }
    }
    std::unique_ptr<ReplicatedPipeline> p(new ReplicatedPipeline());
    p->opt_ = o;
    p->counts_ = counts;
    auto fc = codec::MakeCodec(o.forward_codec);
    if (!fc.ok()) return fc.status();
    auto bc = codec::MakeCodec(o.backward_codec);
    if (!bc.ok()) return bc.status();
    p->fwd_codec_ = std::move(*fc);
    p->bwd_codec_ = std::move(*bc);
    p->slots_.resize(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) {
      stage_runtime::PipelineOptions mine = o;
      mine.micro_batches = ShareOf(counts, M, s);
      for (int r = 0; r < counts[s]; ++r) {
        stage_runtime::StageSpec spec{o.model, (*parts)[s], s == 0, s == S - 1, o.seed, mine.micro_batches, o.optimizer,
                                      o.device, o.precision};
        auto e = stage_runtime::StageExecutor::Create(spec);  // same seed: identical replicas
        if (!e.ok()) return e.status();
        p->slots_[s].push_back(Slot{std::move(*e), mine, {}, {}, nullptr, nullptr});
      }
    }
    // A link pair between every two replicas of neighbouring stages that exchange micro-batches,
    // each end joining its replica's fan.
    for (int s = 0; s + 1 < S; ++s) {
      for (int r = 0; r < counts[s]; ++r) {
        for (int q : ExchangingReplicas(counts, M, s, r, s + 1)) {
          // A link carries the sending replica's share of the step at most.
          p->links_.push_back(stage_runtime::InProcessLink::Pair(s, p->fwd_codec_.get(), p->bwd_codec_.get(),
                                                                 stage_runtime::LinkCapacity(p->slots_[s][r].options),
                                                                 o.codec_threads));
          p->slots_[s][r].next.emplace_back(q, p->links_.back().first.get());
          p->slots_[s + 1][q].prev.emplace_back(r, p->links_.back().second.get());
        }
      }
    }
    for (int s = 0; s < S; ++s) {
      for (int r = 0; r < counts[s]; ++r) {
        Slot& x = p->slots_[s][r];
        x.loop = std::make_unique<stage_runtime::StageLoop>(
            x.options, s, x.executor.get(), stage_runtime::LinkFan::ForReplica(counts, M, s, r, s - 1, x.prev),
            stage_runtime::LinkFan::ForReplica(counts, M, s, r, s + 1, x.next));
      }
    }
    regions = std::max(1, regions);
    collective::InProcessHubOptions shaped;
    if (between_regions.shaped()) {
      shaped.link = [between_regions, regions](int from, int to) {
        return from % regions == to % regions ? netem::LinkProfile{} : between_regions;
      };
    }
    for (int s = 0; s < S; ++s) {
      const int n = counts[s];
      if (n < 2) continue;  // a stage of one: its loop steps the optimizer itself
      std::vector<std::string> region_names;
      for (int r = 0; r < n; ++r) region_names.push_back(absl::StrCat("region-", r % regions));
      // One hub per group, as the worker has one gRPC group for the gradients and one for scalars
      // (the scalars, a few bytes, unshaped as there).
      p->hubs_.push_back(std::make_unique<collective::InProcessHub>(n, shaped));
      p->hubs_.push_back(std::make_unique<collective::InProcessHub>(n));
      collective::InProcessHub& dp = *p->hubs_[p->hubs_.size() - 2];
      collective::InProcessHub& scalars = *p->hubs_.back();
      for (int r = 0; r < n; ++r) {
        worker::ReplicaSyncOptions ro;
        ro.group = absl::StrCat("stage-", s);
        ro.rank = r;
        ro.regions = region_names;
        ro.codec = codec;
        ro.weight_bits = weight_bits;
        ro.seed = o.seed * 1000 + static_cast<uint64_t>(s);  // the worker's (stage_runner.cc)
        Slot& x = p->slots_[s][r];
        auto rs = worker::ReplicaSync::CreateOver(dp.Connect(r), scalars.Connect(r), ro, x.executor.get(), o.optimizer);
        if (!rs.ok()) return rs.status();
        x.sync = std::move(*rs);
        x.loop->SetGradientSync(x.sync.get());
      }
    }
    return p;
  }

  // One step over the step's micro-batches (each replica takes its consecutive share).
  absl::StatusOr<stage_runtime::StepResult> TrainStep(const std::vector<stage_runtime::Batch>& mbs) {
    if (!failed_.ok()) return failed_;
    const int S = opt_.stages, M = opt_.micro_batches;
    if (static_cast<int>(mbs.size()) != M) return absl::InvalidArgumentError("wrong number of micro-batches");
    std::vector<std::vector<absl::StatusOr<stage_runtime::StepResult>>> results(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) results[s].assign(static_cast<size_t>(counts_[s]), absl::UnknownError("not run"));
    absl::Mutex mu;
    absl::Status first_error;
    std::vector<std::thread> threads;
    const absl::Time started = absl::Now();
    for (int s = 0; s < S; ++s) {
      for (int r = 0; r < counts_[s]; ++r) {
        threads.emplace_back([&, r, s] {
          const int m = slots_[s][r].options.micro_batches;
          const std::vector<stage_runtime::Batch> mine(mbs.begin() + r * m, mbs.begin() + (r + 1) * m);
          auto& out = results[s][r];
          out = slots_[s][r].loop->Step(mine);
          if (out.ok()) return;
          {
            absl::MutexLock l(&mu);
            if (!first_error.ok()) return;
            first_error = absl::Status(out.status().code(),
                                       absl::StrCat("replica ", r, " stage ", s, ": ", out.status().message()));
          }
          for (std::vector<Slot>& stage : slots_) {
            for (Slot& x : stage) x.loop->Cancel(first_error);
          }
        });
      }
    }
    for (std::thread& t : threads) t.join();
    if (!first_error.ok()) return failed_ = first_error;
    last_dp_ = collective::CallStats();
    last_stage_dp_.assign(static_cast<size_t>(S), StageDp());
    for (int s = 0; s < S; ++s) {
      for (const Slot& x : slots_[s]) {
        if (x.sync == nullptr) continue;
        const collective::CallStats& c = x.sync->last();
        last_dp_.Add(c);
        StageDp& d = last_stage_dp_[s];
        if (c.wall >= d.wall) {  // the slowest replica's
          d.update = c.update;
          d.phase_starts = c.phase_starts;
          d.bucket_spans = c.bucket_spans;
        }
        d.wall = std::max(d.wall, c.wall);
        d.busiest_link = std::max(d.busiest_link, c.busiest_inter_region_link());
        d.replicas.push_back({c.start - started, c.wall, c.busiest_inter_region_link(), c.update_start, c.update,
                              c.busiest_link_before_update(), c.busiest_link_after_update()});
      }
    }
    return *results[static_cast<size_t>(S - 1)][0];  // replica 0's last stage: its replicas' mean loss
  }

  // Replica 0's model (the replicas' agree, bit for bit for every codec here) through the forward
  // codec, as InProcessPipeline::EvalLoss.
  absl::StatusOr<double> EvalLoss(const std::vector<stage_runtime::Batch>& batches) {
    double sum = 0;
    const int S = opt_.stages;
    for (const stage_runtime::Batch& b : batches) {
      torch::Tensor x = b.tokens;
      for (int s = 0; s < S; ++s) {
        stage_runtime::StageExecutor& e = *slots_[s][0].executor;
        auto y = e.Evaluate(x, s == S - 1 ? b.labels : torch::Tensor());
        if (!y.ok()) return y.status();
        x = *y;
        if (s < S - 1) {
          codec::EncodeOptions eo;
          eo.threads = opt_.codec_threads;
          eo.seed = static_cast<uint64_t>(slots_[0][0].executor->step());
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
  // Each replica's (index: replica): from the step's start to its sync's start (the end of its
  // backward pass; it cannot send a byte before), its sync's wall time and its busiest link's bytes;
  // when its update began after the sync's start (InfiniteDuration: the sync has none), how long it
  // took, and the busiest link's bytes before and after it (CallStats).
  struct ReplicaDp {
    absl::Duration start, wall;
    int64_t busiest_link = 0;
    absl::Duration update_start = absl::InfiniteDuration(), update = absl::ZeroDuration();
    int64_t link_before_update = 0, link_after_update = 0;
  };
  // Per stage, the last step's data-parallel sync: the slowest replica's wall time (from the end of
  // its backward pass, so it includes waiting for the other replicas and, through the clipping norm,
  // for the other stages) and the most bytes one replica sent to one replica in another region (each
  // directed link between regions is shaped on its own: a replica's messages to two such peers may
  // overlap, as BitDP's bit planes and fp32 ring do); each replica's figures (none for a stage of one).
  struct StageDp {
    absl::Duration wall = absl::ZeroDuration();
    absl::Duration update = absl::ZeroDuration();  // of that wall, the slowest replica's update
    std::vector<absl::Duration> phase_starts;      // and when its sync's phases began (CallStats)
    std::vector<collective::BucketSpan> bucket_spans;  // and its bucketed collectives' parts
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
    for (const auto& l : links_) v.push_back(l.first->stats());
    return v;
  }

 private:
  // One replica of one stage.
  struct Slot {
    std::unique_ptr<stage_runtime::StageExecutor> executor;
    stage_runtime::PipelineOptions options;                // micro_batches: its share
    std::vector<std::pair<int, stage_runtime::Link*>> prev, next;  // neighbour replica -> link (links_)
    std::unique_ptr<stage_runtime::StageLoop> loop;
    std::unique_ptr<worker::ReplicaSync> sync;  // null for a stage of one; before the hubs go
  };
  ReplicatedPipeline() = default;

  stage_runtime::PipelineOptions opt_;  // the step's (micro_batches: all replicas')
  std::vector<int> counts_;
  std::unique_ptr<codec::Codec> fwd_codec_, bwd_codec_;
  std::vector<std::unique_ptr<collective::InProcessHub>> hubs_;  // outlive the transports (slots_)
  std::vector<std::pair<std::unique_ptr<stage_runtime::InProcessLink>, std::unique_ptr<stage_runtime::InProcessLink>>>
      links_;                             // outlive the loops (slots_)
  std::vector<std::vector<Slot>> slots_;  // [stage][replica]
  collective::CallStats last_dp_;
  std::vector<StageDp> last_stage_dp_;
  absl::Status failed_;
};

}  // namespace longhaul::bench

#endif  // LONGHAUL_BENCH_REPLICATED_PIPELINE_H_
