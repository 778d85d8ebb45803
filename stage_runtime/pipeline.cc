#include "stage_runtime/pipeline.h"

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace longhaul::stage_runtime {

absl::StatusOr<std::unique_ptr<InProcessPipeline>> InProcessPipeline::Create(const PipelineOptions& o) {
  absl::StatusOr<std::vector<LayerRange>> parts = PartitionLayers(o.model.layers, o.stages);
  if (!parts.ok()) return parts.status();
  if (o.micro_batches < 1 || o.micro_batch_size < 1) {
    return absl::InvalidArgumentError("micro_batches and micro_batch_size must be >= 1");
  }
  std::unique_ptr<InProcessPipeline> p(new InProcessPipeline());
  p->opt_ = o;
  auto fc = codec::MakeCodec(o.forward_codec);
  if (!fc.ok()) return fc.status();
  auto bc = codec::MakeCodec(o.backward_codec);
  if (!bc.ok()) return bc.status();
  p->fwd_codec_ = std::move(*fc);
  p->bwd_codec_ = std::move(*bc);
  for (int s = 0; s < o.stages; ++s) {
    StageSpec spec{o.model, (*parts)[s], s == 0, s == o.stages - 1, o.seed, o.micro_batches, o.optimizer,
                   o.device, o.precision};
    auto e = StageExecutor::Create(spec);
    if (!e.ok()) return e.status();
    p->stages_.push_back(std::move(*e));
  }
  for (int s = 0; s + 1 < o.stages; ++s) {
    p->links_.push_back(
        InProcessLink::Pair(s, p->fwd_codec_.get(), p->bwd_codec_.get(), LinkCapacity(o), o.codec_threads));
  }
  for (int s = 0; s < o.stages; ++s) {
    Link* prev = s > 0 ? p->links_[s - 1].second.get() : nullptr;
    Link* next = s + 1 < o.stages ? p->links_[s].first.get() : nullptr;
    p->loops_.push_back(std::make_unique<StageLoop>(o, s, p->stages_[s].get(), prev, next));
  }
  return p;
}

InProcessPipeline::~InProcessPipeline() = default;

absl::StatusOr<StepResult> InProcessPipeline::TrainStep(const std::vector<Batch>& mbs) {
  if (!failed_.ok()) return failed_;
  const int S = opt_.stages;
  if (static_cast<int>(mbs.size()) != opt_.micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep needs ", opt_.micro_batches, " micro-batches, got ", mbs.size()));
  }
  std::vector<absl::StatusOr<StepResult>> results(S, absl::UnknownError("not run"));
  absl::Mutex mu;
  absl::Status first_error;  // the failure that cancelled the others, not the cancellations it caused
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      results[s] = loops_[s]->Step(mbs);
      if (results[s].ok()) return;
      {
        absl::MutexLock l(&mu);
        if (!first_error.ok()) return;
        first_error = absl::Status(results[s].status().code(),
                                   absl::StrCat("stage ", s, ": ", results[s].status().message()));
      }
      for (auto& loop : loops_) loop->Cancel(first_error);
    });
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) {
    failed_ = first_error;
    return failed_;
  }
  StepResult r = *results.back();  // the last stage has the loss; every stage the same norm
  for (const auto& x : results) r.receive_wait = std::max(r.receive_wait, x->receive_wait);
  return r;
}

absl::StatusOr<double> InProcessPipeline::EvalLoss(const std::vector<Batch>& batches) {
  double sum = 0;
  for (const Batch& b : batches) {
    torch::Tensor x = b.tokens;
    for (int s = 0; s < opt_.stages; ++s) {
      auto y = stages_[s]->Evaluate(x, s == opt_.stages - 1 ? b.labels : torch::Tensor());
      if (!y.ok()) return y.status();
      x = *y;
      if (s < opt_.stages - 1) {
        codec::EncodeOptions eo;
        eo.threads = opt_.codec_threads;
        eo.seed = static_cast<uint64_t>(step());  // as the links seed it
        auto t = CodecRoundTrip(*fwd_codec_, x, eo, /*measure_error=*/false, /*stats=*/nullptr);
        if (!t.ok()) return t.status();
        x = *t;
      }
    }
    sum += x.item<double>();
  }
  return batches.empty() ? 0.0 : sum / batches.size();
}

const std::vector<LinkStats>& InProcessPipeline::forward_links() {
  fwd_stats_.clear();
  for (auto& l : links_) fwd_stats_.push_back(l.first->stats());
  return fwd_stats_;
}

const std::vector<LinkStats>& InProcessPipeline::backward_links() {
  bwd_stats_.clear();
  for (auto& l : links_) bwd_stats_.push_back(l.second->stats());
  return bwd_stats_;
}

std::vector<int64_t> InProcessPipeline::PeakStoredActivations() const {
  std::vector<int64_t> r;
  for (const auto& s : stages_) r.push_back(s->peak_stored_activations());
  return r;
}

absl::Status InProcessPipeline::SaveCheckpoint(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir, ": ", ec.message()));
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (absl::Status s = stages_[i]->SaveCheckpoint(StageCheckpointPath(dir, static_cast<int>(i))); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status InProcessPipeline::LoadCheckpoint(const std::string& dir) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (absl::Status s = stages_[i]->LoadCheckpoint(StageCheckpointPath(dir, static_cast<int>(i))); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace longhaul::stage_runtime
