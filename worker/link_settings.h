// Where a job spec's `links:` section becomes what a link sender runs with. The "0 means default"
// rules of LinkSpec (control_plane.proto, coordinator/job_spec.h) are each decided once:
//   rate_mbit 0       unshaped                               (netem::LinkProfile::shaped)
//   burst_bytes 0     about 1 ms of traffic, as tc tbf gets  (netem::LinkProfile::EffectiveBurstBytes)
//   retransmit_ms 0   max(200 ms, 3 x delay)                 (netem::LinkProfile::EffectiveRetransmit)
//   pace_mbit 0       unpaced; ignored wherever in-process emulation applies, as on links between
//                     regions at between_regions_mbit (netem::LinkProfile::paced)
//   streams 0         1, and 1 whatever was asked when the link is shaped or paced in-process (one
//                     shaper or pacer per link)              (here)
//   codec_device ""   auto                                   (here)
#ifndef LONGHAUL_WORKER_LINK_SETTINGS_H_
#define LONGHAUL_WORKER_LINK_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/codec.h"
#include "longhaul/v1/control_plane.pb.h"
#include "netem/shaper.h"

namespace longhaul::worker {

struct LinkSettings {
  netem::LinkProfile profile;
  int streams = 1;             // gRPC streams (TCP connections) the link is striped over
  // Where the link's codecs run for a stage on a CUDA device (codec::CodecDevice; the stage's
  // links apply it, StageRunner checks that `gpu` can be honoured).
  codec::CodecDevice codec_device = codec::CodecDevice::kAuto;
};

// `seed` seeds the profile's jitter and loss draws. Fails only for a codec_device the job spec's
// validation would have rejected.
absl::StatusOr<LinkSettings> ResolveLinkSpec(const v1::LinkSpec& spec, uint64_t seed);

// The data-parallel links from replica `rank` to every replica of its group (`regions`: each one's
// region), as the spec's links: section makes them (proto/link_spec.h's LinkSpecBetween per pair:
// emulated, at between_regions_mbit across regions, or paced); empty when the section neither
// emulates nor paces (the collective transport's default). `seed` seeds the jitter and loss draws.
absl::StatusOr<std::vector<netem::LinkProfile>> ReplicaLinkProfiles(const v1::LinkSpec& spec,
                                                                    const std::vector<std::string>& regions,
                                                                    int rank, uint64_t seed);

}  // namespace longhaul::worker

#endif  // LONGHAUL_WORKER_LINK_SETTINGS_H_
