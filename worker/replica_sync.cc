#include "worker/replica_sync.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/data_parallel_spec.h"

namespace longhaul::worker {

using collective::DpCodec;

namespace {

absl::Status CheckGroup(const ReplicaSyncOptions& o, int P) {
  if (P < 2 || o.rank < 0 || o.rank >= P || static_cast<int>(o.regions.size()) != P) {
    return absl::InvalidArgumentError(absl::StrCat("replica group ", o.group, ": rank ", o.rank, " of ", P,
                                                   " replicas with ", o.regions.size(), " regions"));
  }
  return absl::OkStatus();
}

constexpr char kMainKey[] = "main";
constexpr char kExpAvgKey[] = "exp_avg";
constexpr char kExpAvgSqKey[] = "exp_avg_sq";

bool Sharded(DpCodec c) { return DpCodecShardsOptimizerState(DpCodecName(c)); }

torch::Tensor ToTensor(absl::Span<const float> v) {
  if (v.empty()) return torch::empty({0}, torch::kFloat32);
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kFloat32).clone();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaSync>> ReplicaSync::Create(collective::CollectiveService* service,
                                                                 ReplicaSyncOptions o,
                                                                 stage_runtime::StageExecutor* exec,
                                                                 stage_runtime::OptimizerConfig optimizer) {
  if (absl::Status s = CheckGroup(o, static_cast<int>(o.addresses.size())); !s.ok()) return s;
  std::unique_ptr<ReplicaSync> rs(new ReplicaSync(std::move(o), exec, optimizer));
  const ReplicaSyncOptions& ro = rs->o_;
  // Two groups on the worker's one Collective service: the data-parallel calls, and the scalars
  // (norms, losses) that the sharded step needs in the middle of its own calls.
  for (int k = 0; k < 2; ++k) {
    collective::GrpcTransportOptions t;
    t.group = k == 0 ? ro.group : absl::StrCat(ro.group, "/scalars");
    t.rank = ro.rank;
    t.addresses = ro.addresses;
    t.names = ro.names;
    if (k == 0) t.links = ro.links;  // the scalars are a few bytes: not shaped
    absl::StatusOr<std::unique_ptr<collective::GrpcTransport>> tr = collective::GrpcTransport::Create(service, t);
    if (!tr.ok()) return tr.status();
    (k == 0 ? rs->dp_transport_ : rs->scalar_transport_) = std::move(*tr);
  }
  if (absl::Status s = rs->Init(); !s.ok()) return s;
  return rs;
}

absl::StatusOr<std::unique_ptr<ReplicaSync>> ReplicaSync::CreateOver(std::unique_ptr<collective::Transport> dp,
                                                                     std::unique_ptr<collective::Transport> scalars,
                                                                     ReplicaSyncOptions o,
                                                                     stage_runtime::StageExecutor* exec,
                                                                     stage_runtime::OptimizerConfig optimizer) {
  if (dp == nullptr || scalars == nullptr || dp->rank() != o.rank || scalars->rank() != o.rank ||
      dp->size() != scalars->size()) {
    return absl::InvalidArgumentError(absl::StrCat("replica group ", o.group, ": transports of rank ", o.rank,
                                                   " expected"));
  }
  if (absl::Status s = CheckGroup(o, dp->size()); !s.ok()) return s;
  std::unique_ptr<ReplicaSync> rs(new ReplicaSync(std::move(o), exec, optimizer));
  rs->dp_transport_ = std::move(dp);
  rs->scalar_transport_ = std::move(scalars);
  if (absl::Status s = rs->Init(); !s.ok()) return s;
  return rs;
}

absl::Status ReplicaSync::Init() {
  std::vector<std::string> regions = o_.regions;
  for (std::string& r : regions) {
    if (r.empty()) r = "default";
  }
  absl::StatusOr<collective::Topology> topo = collective::Topology::Create(regions);
  if (!topo.ok()) return topo.status();
  collective::GroupOptions go;
  go.timeout = o_.timeout;
  dp_group_ = std::make_unique<collective::Group>(dp_transport_.get(), *topo, go);
  scalar_group_ = std::make_unique<collective::Group>(scalar_transport_.get(), *topo, go);

  std::vector<collective::ParamShape> shapes;
  for (const auto& [name, p] : exec_->parameters()) {
    shapes.push_back({name, p.sizes().vec()});
    n_ += p.numel();
    decayed_.insert(decayed_.end(), static_cast<size_t>(p.numel()), p.dim() >= 2 ? 1 : 0);
  }
  collective::DpOptions dpo = collective::DefaultDpOptions(o_.codec);
  if (o_.weight_bits > 0) dpo.weights.bits = o_.weight_bits;
  dpo.seed = o_.seed;
  if (o_.codec == DpCodec::kBitDp1 || o_.codec == DpCodec::kBitDp2) dpo.bitdp_layout = collective::BitDpLayoutFor(shapes);
  if (o_.codec != DpCodec::kFp32) {
    absl::StatusOr<std::unique_ptr<collective::DataParallelSync>> dp =
        collective::DataParallelSync::Create(dp_group_.get(), n_, dpo);
    if (!dp.ok()) return dp.status();
    dp_ = std::move(*dp);
  }
  // The model copy the sharded codecs start from: identical on every replica (the same seed, or
  // the same checkpoint).
  if (Sharded(o_.codec)) Flatten(/*grads=*/false, &weights_);
  return absl::OkStatus();
}

collective::CallStats ReplicaSync::totals() const {
  collective::CallStats t = dp_group_->totals();
  t.Add(scalar_group_->totals());
  return t;
}

ReplicaSync::~ReplicaSync() = default;

void ReplicaSync::Abort(const absl::Status& why) {
  if (dp_transport_) dp_transport_->Abort(why);
  if (scalar_transport_) scalar_transport_->Abort(why);
}

void ReplicaSync::Flatten(bool grads, std::vector<float>* out) const {
  out->resize(static_cast<size_t>(n_));
  int64_t off = 0;
  for (const auto& [name, p] : exec_->parameters()) {
    const int64_t k = p.numel();
    const torch::Tensor src = grads ? p.grad() : p;
    if (src.defined()) {
      const torch::Tensor c = src.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      std::memcpy(out->data() + off, c.data_ptr<float>(), static_cast<size_t>(k) * sizeof(float));
    } else {
      std::fill(out->begin() + off, out->begin() + off + k, 0.0f);
    }
    off += k;
  }
}

void ReplicaSync::Unflatten(const std::vector<float>& in, bool grads) {
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (const auto& [name, p] : exec_->parameters()) {
    torch::Tensor src = torch::from_blob(const_cast<float*>(in.data() + off), p.sizes(), torch::kFloat32);
    torch::Tensor dst = p;
    if (grads) {
      // A parameter this stage's step did not touch gets the replicas' gradient all the same.
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      dst = p.grad();
    }
    dst.copy_(src);
    off += p.numel();
  }
}

stage_runtime::TensorFile ReplicaSync::CheckpointState() const {
  stage_runtime::TensorFile f;
  if (!Sharded(o_.codec)) return f;
  // After a step main() holds the owned range (possibly none: a small stage among many replicas).
  f.tensors[kMainKey] = ToTensor(dp_->main());
  f.tensors[kExpAvgKey] = ToTensor(m_);
  f.tensors[kExpAvgSqKey] = ToTensor(v_);
  f.metadata["codec"] = collective::DpCodecName(o_.codec);
  f.metadata["rank"] = std::to_string(o_.rank);
  f.metadata["replicas"] = std::to_string(dp_group_->size());
  return f;
}

absl::Status ReplicaSync::RestoreState(const stage_runtime::TensorFile& state) {
  if (!Sharded(o_.codec)) return absl::OkStatus();
  const std::string who = absl::StrCat("replica ", o_.rank, " of ", dp_group_->size(), " (data_parallel.codec ",
                                       collective::DpCodecName(o_.codec), ")");
  auto meta = [&](const char* key) {
    auto it = state.metadata.find(key);
    return it == state.metadata.end() ? std::string("(none)") : it->second;
  };
  if (state.tensors.empty()) {
    return absl::DataLossError(absl::StrCat("the checkpoint of step ", exec_->step(), " has no sharded optimizer state for ",
                                            who, " (written by a version that did not keep it)"));
  }
  if (meta("codec") != collective::DpCodecName(o_.codec) || meta("rank") != std::to_string(o_.rank) ||
      meta("replicas") != std::to_string(dp_group_->size())) {
    return absl::DataLossError(absl::StrCat("the checkpoint of step ", exec_->step(), " holds the optimizer shard of replica ",
                                            meta("rank"), " of ", meta("replicas"), " (", meta("codec"), "), not of ", who));
  }
  const int64_t len = dp_->owned_length();
  if (state.tensors.size() != 3) {
    return absl::DataLossError(absl::StrCat("the checkpoint of step ", exec_->step(), " holds ", state.tensors.size(),
                                            " optimizer shard tensors for ", who, "; 3 expected (main, exp_avg, exp_avg_sq)"));
  }
  std::vector<std::vector<float>> parts;
  for (const char* key : {kMainKey, kExpAvgKey, kExpAvgSqKey}) {
    auto it = state.tensors.find(key);
    if (it == state.tensors.end() || it->second.scalar_type() != torch::kFloat32 || it->second.dim() != 1 ||
        it->second.numel() != len) {
      return absl::DataLossError(absl::StrCat("the checkpoint of step ", exec_->step(), ": the optimizer shard's ", key,
                                              " of ", who, " is missing or not ", len, " fp32 elements"));
    }
    const torch::Tensor t = it->second.to(torch::kCPU).contiguous();
    const float* p = len > 0 ? t.data_ptr<float>() : nullptr;
    parts.emplace_back(p, p + len);
  }
  if (absl::Status s = dp_->Restore(parts[0], static_cast<uint64_t>(exec_->step())); !s.ok()) return s;
  m_ = std::move(parts[1]);
  v_ = std::move(parts[2]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ReplicaSync::SumScalars(const std::vector<double>& values) {
  std::string mine(values.size() * sizeof(double), '\0');
  std::memcpy(mine.data(), values.data(), mine.size());
  std::vector<std::string> all;
  const int P = scalar_group_->size();
  absl::StatusOr<collective::CallStats> s = scalar_group_->AllGatherBytes(
      std::move(mine), std::vector<int64_t>(static_cast<size_t>(P), static_cast<int64_t>(values.size() * sizeof(double))),
      &all);
  if (!s.ok()) return s.status();
  std::vector<double> sum(values.size(), 0.0);
  for (int k = 0; k < P; ++k) {  // rank order: the same doubles on every replica
    for (size_t i = 0; i < values.size(); ++i) {
      double v = 0;
      std::memcpy(&v, all[static_cast<size_t>(k)].data() + i * sizeof(double), sizeof(double));
      sum[i] += v;
    }
  }
  return sum;
}

void ReplicaSync::Adam(int64_t step, int64_t offset, absl::Span<const float> grad, absl::Span<float> main,
                       double scale) {
  // The executor's AdamW (stage_runtime/executor.cc), element by element on the owned range.
  const double lr = opt_.LearningRate(step);
  const double t = static_cast<double>(step + 1);
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  const float bc2 = static_cast<float>(1 - std::pow(opt_.beta2, t));
  const float step_size = static_cast<float>(lr / (1 - std::pow(opt_.beta1, t)));
  const float decay = static_cast<float>(1 - lr * opt_.weight_decay), eps = static_cast<float>(opt_.eps);
  const float s = static_cast<float>(scale);
  if (m_.size() != main.size()) {
    m_.assign(main.size(), 0.0f);
    v_.assign(main.size(), 0.0f);
  }
  for (size_t i = 0; i < main.size(); ++i) {
    const float g = grad[i] * s;
    m_[i] = b1 * m_[i] + (1 - b1) * g;
    v_[i] = b2 * v_[i] + (1 - b2) * g * g;
    if (decayed_[static_cast<size_t>(offset) + i]) main[i] *= decay;
    main[i] -= step_size * m_[i] / (std::sqrt(v_[i] / bc2) + eps);
  }
}

absl::StatusOr<stage_runtime::GradientSync::Outcome> ReplicaSync::SyncAndStep(uint64_t step, double loss,
                                                                              const ExchangeNorms& exchange_norms) {
  const int P = dp_group_->size();
  Outcome out;
  last_ = collective::CallStats();
  Flatten(/*grads=*/true, &grad_);
  if (Sharded(o_.codec)) {
    // Sharded optimizer: the clip factor is known only once the gradient is reduced, inside the
    // step (collective/data_parallel.h calls `update` between the reduce-scatter and the weights'
    // all-gather).
    absl::Status inner;
    auto update = [&](int64_t offset, absl::Span<const float> grad_sum, absl::Span<float> main) {
      double sq = 0;
      for (float g : grad_sum) {
        const double x = static_cast<double>(g) / P;
        sq += x * x;
      }
      absl::StatusOr<std::vector<double>> sums = SumScalars({sq, loss});
      if (!sums.ok()) {
        inner = sums.status();
        return;
      }
      absl::StatusOr<double> total = exchange_norms((*sums)[0]);
      if (!total.ok()) {
        inner = total.status();
        return;
      }
      out.grad_norm = std::sqrt(*total);
      out.loss = (*sums)[1] / P;
      Adam(static_cast<int64_t>(step), offset, grad_sum, main, opt_.ClipFactor(out.grad_norm) / P);
    };
    absl::StatusOr<collective::CallStats> s = dp_->Step(grad_, absl::MakeSpan(weights_), update);
    if (!inner.ok()) {
      Abort(inner);  // the other replicas are in the same step: let them fail now
      return inner;
    }
    if (!s.ok()) return s.status();
    last_ = *s;
    Unflatten(weights_, /*grads=*/false);
    if (absl::Status a = exec_->AdvanceStep(); !a.ok()) return a;
    return out;
  }
  // Replicated optimizer (fp32, BitDP): the same summed gradient on every replica.
  if (o_.codec == DpCodec::kFp32) {
    absl::StatusOr<collective::CallStats> s = dp_group_->AllReduceFp32(absl::MakeSpan(grad_));
    if (!s.ok()) return s.status();
    last_ = *s;
    for (float& g : grad_) g /= static_cast<float>(P);
  } else {
    Flatten(/*grads=*/false, &weights_);  // BitDP leaves the weights to the optimizer
    absl::StatusOr<collective::CallStats> s =
        dp_->Step(grad_, absl::MakeSpan(weights_), [&](int64_t, absl::Span<const float> sum, absl::Span<float>) {
          for (size_t i = 0; i < sum.size(); ++i) grad_[i] = sum[i] / static_cast<float>(P);
        });
    if (!s.ok()) return s.status();
    last_ = *s;
  }
  Unflatten(grad_, /*grads=*/true);
  absl::StatusOr<std::vector<double>> sums = SumScalars({loss});
  if (!sums.ok()) return sums.status();
  out.loss = (*sums)[0] / P;
  absl::StatusOr<double> total = exchange_norms(exec_->SquaredGradNorm());
  if (!total.ok()) return total.status();
  out.grad_norm = std::sqrt(*total);
  if (absl::Status s = exec_->Step(opt_.ClipFactor(out.grad_norm)); !s.ok()) return s;
  return out;
}

}  // namespace longhaul::worker
