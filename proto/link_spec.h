// The job's emulated link settings (v1::LinkSpec) for one link, given the regions of its two ends:
// links between regions run at links.between_regions_mbit where the spec sets it. Used by the
// workers' senders (what they shape) and the coordinator's placement (what it predicts).
#ifndef LONGHAUL_PROTO_LINK_SPEC_H_
#define LONGHAUL_PROTO_LINK_SPEC_H_

#include <string>

#include "longhaul/v1/control_plane.pb.h"

namespace longhaul {

inline v1::LinkSpec LinkSpecBetween(const v1::LinkSpec& spec, const std::string& from_region,
                                    const std::string& to_region) {
  v1::LinkSpec l = spec;
  if (from_region != to_region && spec.between_regions_mbit() > 0) l.set_rate_mbit(spec.between_regions_mbit());
  l.clear_between_regions_mbit();
  return l;
}

// Whether a link's settings emulate anything in-process (a rate, delay, jitter or loss; the
// worker's netem::LinkProfile::shaped). links.pace_mbit is not emulation.
inline bool EmulatesLink(const v1::LinkSpec& l) {
  return l.rate_mbit() > 0 || l.delay_ms() > 0 || l.jitter_ms() > 0 || l.loss() > 0;
}

}  // namespace longhaul

#endif  // LONGHAUL_PROTO_LINK_SPEC_H_
