#include "stage_runtime/link.h"

#include "common/torch_status.h"

namespace longhaul::stage_runtime {

const char* MessageKindName(MessageKind k) {
  switch (k) {
    case MessageKind::kActivation: return "activation";
    case MessageKind::kGradient: return "gradient";
    case MessageKind::kNormPartial: return "partial gradient norm";
    case MessageKind::kNormTotal: return "total gradient norm";
  }
  return "unknown";
}

double RelativeL2Error(const torch::Tensor& x, const torch::Tensor& y) {
  absl::StatusOr<double> r = CatchTorch("relative error", [&]() -> absl::StatusOr<double> {
    const torch::Tensor xd = x.detach().to(torch::kFloat64);
    const double n = xd.norm().item<double>();
    if (n == 0) return 0.0;
    return (xd - y.detach().to(xd.device(), torch::kFloat64)).norm().item<double>() / n;
  });
  // Shapes that do not match are a caller's bug; report the error as "no similarity at all".
  return r.ok() ? *r : 1.0;
}

}  // namespace longhaul::stage_runtime
