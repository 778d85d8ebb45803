#include "worker/link_settings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/link_spec.h"

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

absl::StatusOr<std::vector<netem::LinkProfile>> ReplicaLinkProfiles(const v1::LinkSpec& spec,
                                                                    const std::vector<std::string>& regions,
                                                                    int rank, uint64_t seed) {
  if (rank < 0 || rank >= static_cast<int>(regions.size())) {
    return absl::InvalidArgumentError(absl::StrCat("replica ", rank, " of a group of ", regions.size()));
  }
  std::vector<netem::LinkProfile> links;
  bool any = false;
  for (const std::string& peer : regions) {
    absl::StatusOr<LinkSettings> ls = ResolveLinkSpec(LinkSpecBetween(spec, regions[static_cast<size_t>(rank)], peer), seed);
    if (!ls.ok()) return ls.status();
    any = any || ls->profile.shaped() || ls->profile.paced();
    links.push_back(ls->profile);
  }
  if (!any) links.clear();
  return links;
}

}  // namespace longhaul::worker
