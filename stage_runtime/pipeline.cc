#include "stage_runtime/pipeline.h"

#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::k1F1B;
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule \"", name, "\" (gpipe or 1f1b)"));
}

std::vector<PipelineOp> StageSchedule(Schedule s, int stage, int stages, int m) {
  std::vector<PipelineOp> ops;
  if (s == Schedule::kGPipe) {
    for (int i = 0; i < m; ++i) ops.push_back({true, i});
    for (int i = 0; i < m; ++i) ops.push_back({false, i});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    ops.push_back({true, warmup + i});
    ops.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) ops.push_back({false, i});
  return ops;
}

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
    StageSpec spec{o.model, (*parts)[s], s == 0, s == o.stages - 1, o.seed, o.micro_batches, o.optimizer};
    auto e = StageExecutor::Create(spec);
    if (!e.ok()) return e.status();
    p->stages_.push_back(std::move(*e));
  }
  p->fwd_stats_.resize(o.stages - 1);
  p->bwd_stats_.resize(o.stages - 1);
  return p;
}

absl::StatusOr<torch::Tensor> InProcessPipeline::Transfer(const torch::Tensor& x, const codec::Codec& c,
                                                          LinkStats* st) {
  auto frame = c.Encode(x, {opt_.codec_threads});
  if (!frame.ok()) return frame.status();
  auto y = codec::DecodeFrame(*frame, {opt_.codec_threads});
  if (!y.ok()) return y.status();
  st->frames++;
  st->raw_bytes += x.numel() * 4;
  st->wire_bytes += static_cast<int64_t>(frame->size());
  const double n = x.norm().item<double>();
  st->sum_rel_error += n > 0 ? (x - *y).norm().item<double>() / n : 0.0;
  return *y;
}

absl::StatusOr<StepResult> InProcessPipeline::TrainStep(const std::vector<Batch>& mbs) {
  const int S = opt_.stages, M = opt_.micro_batches;
  if (static_cast<int>(mbs.size()) != M) {
    return absl::InvalidArgumentError(absl::StrCat("TrainStep needs ", M, " micro-batches, got ", mbs.size()));
  }
  std::vector<std::vector<PipelineOp>> ops(S);
  for (int s = 0; s < S; ++s) ops[s] = StageSchedule(opt_.schedule, s, S, M);
  std::vector<size_t> next(S, 0);
  // Tensors in flight: acts[s][mb] is stage s's input, grads[s][mb] its output gradient.
  std::vector<std::map<int, torch::Tensor>> acts(S), grads(S);
  double loss_sum = 0;
  size_t done = 0, total = 0;
  for (auto& v : ops) total += v.size();
  while (done < total) {
    bool progressed = false;
    for (int s = 0; s < S; ++s) {
      if (next[s] == ops[s].size()) continue;
      const PipelineOp op = ops[s][next[s]];
      if (op.forward) {
        torch::Tensor in = s == 0 ? mbs[op.micro_batch].tokens : torch::Tensor();
        if (s > 0) {
          auto it = acts[s].find(op.micro_batch);
          if (it == acts[s].end()) continue;
          in = it->second;
          acts[s].erase(it);
        }
        auto out = stages_[s]->Forward(op.micro_batch, in, s == S - 1 ? mbs[op.micro_batch].labels : torch::Tensor());
        if (!out.ok()) return out.status();
        if (s == S - 1) {
          loss_sum += out->item<double>();
        } else {
          auto y = Transfer(*out, *fwd_codec_, &fwd_stats_[s]);
          if (!y.ok()) return y.status();
          acts[s + 1][op.micro_batch] = *y;
        }
      } else {
        torch::Tensor g;
        if (s < S - 1) {
          auto it = grads[s].find(op.micro_batch);
          if (it == grads[s].end()) continue;
          g = it->second;
          grads[s].erase(it);
        }
        auto gin = stages_[s]->Backward(op.micro_batch, g);
        if (!gin.ok()) return gin.status();
        if (s > 0) {
          auto y = Transfer(*gin, *bwd_codec_, &bwd_stats_[s - 1]);
          if (!y.ok()) return y.status();
          grads[s - 1][op.micro_batch] = *y;
        }
      }
      ++next[s];
      ++done;
      progressed = true;
    }
    if (!progressed) return absl::InternalError("pipeline schedule deadlocked");
  }
  // Global gradient clipping: every stage's share of the squared norm.
  double sq = 0;
  for (auto& st : stages_) sq += st->SquaredGradNorm();
  const double norm = std::sqrt(sq);
  const double clip = opt_.optimizer.ClipFactor(norm);
  StepResult r;
  r.step = stages_[0]->step();
  for (auto& st : stages_) {
    if (absl::Status s = st->Step(clip); !s.ok()) return s;
  }
  r.loss = loss_sum / M;
  r.grad_norm = norm;
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
        LinkStats ignored;
        auto t = Transfer(x, *fwd_codec_, &ignored);
        if (!t.ok()) return t.status();
        x = *t;
      }
    }
    sum += x.item<double>();
  }
  return batches.empty() ? 0.0 : sum / batches.size();
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
    if (absl::Status s = stages_[i]->SaveCheckpoint(absl::StrCat(dir, "/stage-", i, ".safetensors")); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status InProcessPipeline::LoadCheckpoint(const std::string& dir) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (absl::Status s = stages_[i]->LoadCheckpoint(absl::StrCat(dir, "/stage-", i, ".safetensors")); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace longhaul::stage_runtime
