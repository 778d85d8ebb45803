#include "worker/link_settings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace longhaul::worker {

absl::StatusOr<LinkSettings> ResolveLinkSpec(const v1::LinkSpec& spec, uint64_t seed) {
  LinkSettings s;
  netem::LinkProfile& p = s.profile;
  p.rate_bytes_per_s = netem::MbitToBytesPerSecond(spec.rate_mbit());
  p.burst_bytes = spec.burst_bytes();
  p.delay = absl::Microseconds(static_cast<int64_t>(spec.delay_ms() * 1000));
  p.jitter = absl::Microseconds(static_cast<int64_t>(spec.jitter_ms() * 1000));
  p.loss = spec.loss();
  p.retransmit = absl::Microseconds(static_cast<int64_t>(spec.retransmit_ms() * 1000));
  p.pace_bytes_per_s = netem::MbitToBytesPerSecond(spec.pace_mbit());
  p.seed = seed;
  s.streams = p.shaped() || p.paced() ? 1 : std::max(1, spec.streams());
  if (!spec.codec_device().empty()) {
    absl::StatusOr<codec::CodecDevice> d = codec::ParseCodecDevice(spec.codec_device());
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("links.codec_device: ", d.status().message()));
    s.codec_device = *d;
  }
  return s;
}

}  // namespace longhaul::worker
