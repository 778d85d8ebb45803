// LinkFan: the links from one replica of a stage to the replicas of one neighbouring stage that it
// exchanges micro-batches with, as the step loop (stage_loop.h) sees them. With the same replica
// count on both stages that is one link and nothing changes; where the counts differ (a job's
// `replicas: [2, 1]`, worker/stage_runner.h) a replica's micro-batches go to several neighbours, or
// come from several.
//
// Micro-batches are numbered per replica (0 .. its share - 1, the schedule's numbering). Replica r
// of a stage whose replicas take m micro-batches each runs the step's global micro-batches
// r*m .. r*m + m - 1 (proto/replica_layout.h); a tensor message goes to the member whose range
// holds its global index, numbered as that member numbers it, so the receiver's checks see its own
// numbering (and a message received through a member carries this replica's numbering). Norm
// messages go to and come from every member.
//
// Threading: as Link's (the owning stage's compute thread; Abort from any thread).
#ifndef LONGHAUL_STAGE_RUNTIME_LINK_FAN_H_
#define LONGHAUL_STAGE_RUNTIME_LINK_FAN_H_

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/replica_counts.h"
#include "stage_runtime/link.h"

namespace longhaul::stage_runtime {

class LinkFan {
 public:
  struct Member {
    Link* link = nullptr;
    int first = 0;  // the neighbour replica's first global micro-batch of the step
    int count = 0;  // how many it takes
  };
  // Where a micro-batch goes: the member's link and the member's number for it.
  struct Route {
    Link* link = nullptr;
    int micro_batch = 0;
  };

  LinkFan() = default;  // no neighbour (the first stage's prev, the last stage's next)
  // One link whose far end numbers micro-batches as this replica does.
  explicit LinkFan(Link* link) {
    if (link != nullptr) members_.push_back({link, 0, 1 << 30});
  }
  // `first`: this replica's first global micro-batch. `gradient_scale`: the factor the step loop
  // applies to the activation gradients received through this fan (N_this / N_neighbour: see
  // StageLoop::Step).
  LinkFan(std::vector<Member> members, int first, double gradient_scale)
      : members_(std::move(members)), first_(first), gradient_scale_(gradient_scale) {}

  // The fan of replica `replica` of `stage` to the replicas of stage `neighbour`, laid out by the
  // stages' replica counts and the step's micro-batches (common/replica_counts.h): `links` pairs a
  // replica of `neighbour` with the link to it; each member takes that replica's share of the step,
  // this replica starts at its own, and the gradients received are scaled by N_stage / N_neighbour.
  // Empty when `links` is or there is no such neighbouring stage.
  static LinkFan ForReplica(const std::vector<int>& counts, int micro_batches, int stage, int replica, int neighbour,
                            const std::vector<std::pair<int, Link*>>& links) {
    if (links.empty() || neighbour < 0 || neighbour >= static_cast<int>(counts.size())) return {};
    const int m = ShareOf(counts, micro_batches, neighbour);
    std::vector<Member> members;
    for (const auto& [q, link] : links) members.push_back({link, q * m, m});
    return LinkFan(std::move(members), replica * ShareOf(counts, micro_batches, stage),
                   static_cast<double>(counts[stage]) / counts[neighbour]);
  }

  bool empty() const { return members_.empty(); }
  const std::vector<Member>& members() const { return members_; }
  double gradient_scale() const { return gradient_scale_; }

  // The member that takes this replica's micro-batch `micro_batch`; a null link when none does (a
  // layout the coordinator would not make).
  Route For(int micro_batch) const {
    const int global = first_ + micro_batch;
    for (const Member& m : members_) {
      if (global >= m.first && global < m.first + m.count) return {m.link, global - m.first};
    }
    return {};
  }

  void Abort(const absl::Status& why) const {
    for (const Member& m : members_) m.link->Abort(why);
  }

 private:
  std::vector<Member> members_;
  int first_ = 0;
  double gradient_scale_ = 1;
};

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_LINK_FAN_H_
