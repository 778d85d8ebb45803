#include "worker/link_settings.h"

#include <algorithm>

namespace longhaul::worker {

LinkSettings ResolveLinkSpec(const v1::LinkSpec& spec, uint64_t seed) {
  LinkSettings s;
  netem::LinkProfile& p = s.profile;
  p.rate_bytes_per_s = netem::MbitToBytesPerSecond(spec.rate_mbit());
  p.burst_bytes = spec.burst_bytes();
  p.delay = absl::Microseconds(static_cast<int64_t>(spec.delay_ms() * 1000));
  p.jitter = absl::Microseconds(static_cast<int64_t>(spec.jitter_ms() * 1000));
  p.loss = spec.loss();
  p.retransmit = absl::Microseconds(static_cast<int64_t>(spec.retransmit_ms() * 1000));
  p.seed = seed;
  s.streams = p.shaped() ? 1 : std::max(1, spec.streams());
  return s;
}

}  // namespace longhaul::worker
