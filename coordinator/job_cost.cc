#include "coordinator/job_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/bitdp.h"
#include "codec/frame.h"
#include "codec/spec.h"
#include "codec/sym_quant.h"
#include "proto/link_spec.h"
#include "stage_runtime/partition.h"

namespace longhaul::coordinator {

absl::StatusOr<double> WireBytes(const std::string& codec_spec, int64_t tokens, int64_t dim) {
  absl::StatusOr<codec::CodecSpec> s = codec::ParseCodecSpec(codec_spec);
  if (!s.ok()) return s.status();
  const codec::CodecTraits* t = codec::FindCodecTraits(s->name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("no codec named ", s->name));
  // Activations and their gradients are [batch, context, hidden]: three dimensions in the header.
  const double header = static_cast<double>(codec::kFrameFixedHeaderBytes) + 8 * 3;
  const double n = static_cast<double>(tokens) * static_cast<double>(dim);
  switch (t->family) {
    case codec::CodecFamily::kRaw:
      return header + n * t->wire_bytes;
    case codec::CodecFamily::kGroupQuant: {
      // Per token: a bit width and an exponent byte, 3 bytes per group, the packed codes (the
      // pivot bytes of transformed groups are rare and left out).
      const codec::GroupQuantParams& p = s->group_quant;
      const double groups = std::ceil(static_cast<double>(dim) / p.group_size);
      const double bits = p.ratio * p.bits_hi + (1 - p.ratio) * p.bits_lo;
      return header + static_cast<double>(tokens) * (2 + 3 * groups + std::ceil(static_cast<double>(dim) * bits / 8));
    }
    case codec::CodecFamily::kSymQuant:
      return header + static_cast<double>(codec::SymQuantPayloadBytes(tokens * dim, s->sym_quant));
    case codec::CodecFamily::kBitDp:
      return header + static_cast<double>(codec::BitDpPayloadBytes(tokens, dim, s->bitdp_bits));
  }
  return absl::InternalError("unknown codec family");
}

absl::StatusOr<placement::JobShape> JobShapeOf(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  absl::StatusOr<std::vector<stage_runtime::LayerRange>> parts = stage_runtime::PartitionLayers(m.layers(), spec.stages());
  if (!parts.ok()) return parts.status();
  const double h = m.hidden(), T = m.context(), V = m.vocab();
  const double n = static_cast<double>(spec.micro_batch_size()) * T;  // tokens per micro-batch
  const double block_fwd = 24 * n * h * h + 4 * n * T * h;
  const double block_params = 12 * h * h + 13 * h;  // weights, biases, two layer norms
  placement::JobShape job;
  job.stages = spec.stages();
  job.replicas = 1;
  job.micro_batches = std::max(spec.micro_batches(), 1);
  // (job_spec.cc validates the name; its default, like the stage runtime's, is 1F1B.)
  job.schedule = spec.schedule() == "gpipe" ? placement::Schedule::kGPipe : placement::Schedule::k1F1B;
  job.forward_share = 1.0 / 3;  // training is 3x forward: the backward pass is the other 2/3
  for (int s = 0; s < job.stages; ++s) {
    const double blocks = (*parts)[s].end - (*parts)[s].begin;
    double fwd = blocks * block_fwd;
    double params = blocks * block_params;
    if (s == 0) params += (V + T) * h;  // token and position embeddings
    if (s == job.stages - 1) {
      fwd += 2 * n * h * V;  // LM head
      params += V * h + 2 * h;  // LM head (untied) and the final layer norm
    }
    job.stage_flops.push_back(3 * fwd);
    job.stage_grad_bytes.push_back(4 * params);
  }
  const int64_t tokens = static_cast<int64_t>(n);
  absl::StatusOr<double> act = WireBytes(spec.forward_codec(), tokens, m.hidden());
  if (!act.ok()) return act.status();
  absl::StatusOr<double> grad = WireBytes(spec.backward_codec(), tokens, m.hidden());
  if (!grad.ok()) return grad.status();
  job.activation_bytes = *act;
  job.gradient_bytes = *grad;
  return job;
}

placement::Link EffectiveLink(double rtt_ms, double mbit_per_s, const v1::LinkSpec& spec,
                              const std::string& from_region, const std::string& to_region) {
  const v1::LinkSpec emulation = LinkSpecBetween(spec, from_region, to_region);
  placement::Link l;
  l.latency_s = std::max(rtt_ms, 0.0) / 2e3 + std::max(emulation.delay_ms(), 0.0) / 1e3;
  double mbit = mbit_per_s;
  // An emulated rate caps the link; so does the senders' pace on a real one (LinkProfile::paced).
  const double cap = emulation.rate_mbit() > 0 ? emulation.rate_mbit() : emulation.pace_mbit();
  if (cap > 0) mbit = mbit > 0 ? std::min(mbit, cap) : 0;
  l.bytes_per_s = mbit > 0 ? mbit * 1e6 / 8 : 0;
  return l;
}

}  // namespace longhaul::coordinator
