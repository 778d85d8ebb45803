// Which worker may send a replica its frames (AssignedNeighbour, worker/stage_runner.h: the data
// plane's sender check under mutual TLS, and the inboxes a stage opens): the replicas of the
// neighbouring stages whose share of the step overlaps this replica's (proto/replica_layout.h).
#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/stage_runner.h"

namespace longhaul::worker {
namespace {

// Replica `replica` of `stage` in a 4-micro-batch job with these counts (equal counts as
// `replicas: N`, else as a list), its neighbours' replicas named "s<stage>r<replica>".
v1::StageAssignment Assignment(const std::vector<int>& counts, int stage, int replica) {
  v1::StageAssignment a;
  v1::JobSpec* spec = a.mutable_spec();
  spec->set_stages(static_cast<int>(counts.size()));
  spec->set_micro_batches(4);
  bool equal = true;
  for (const int n : counts) equal &= n == counts[0];
  if (equal) {
    spec->set_replicas(counts[0]);
  } else {
    for (const int n : counts) spec->add_stage_replicas(n);
  }
  a.set_stage(stage);
  a.set_replica_index(replica);
  for (const int n : {stage - 1, stage + 1}) {
    if (n < 0 || n >= static_cast<int>(counts.size())) continue;
    for (int q = 0; q < counts[n]; ++q) {
      (n < stage ? a.add_prev_replicas() : a.add_next_replicas())->set_name(absl::StrCat("s", n, "r", q));
    }
  }
  return a;
}

std::string Name(const v1::StagePeer* p) { return p == nullptr ? "none" : p->name(); }

TEST(AssignedNeighbour, EqualCountsPairReplicaWithReplica) {
  const v1::StageAssignment a = Assignment({2, 2, 2}, 1, 1);
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 1)), "s0r1");
  EXPECT_EQ(Name(AssignedNeighbour(a, 2, 1)), "s2r1");
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 0)), "none");  // replica 0's pipeline is not this one's
  EXPECT_EQ(Name(AssignedNeighbour(a, 1, 0)), "none");  // its own stage
  EXPECT_EQ(Name(AssignedNeighbour(a, 3, 1)), "none");  // no such stage
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, -1)), "none");
}

TEST(AssignedNeighbour, DifferingCountsFanInAndOut) {
  // [2, 1]: stage 1's one worker takes micro-batches from both of stage 0's.
  v1::StageAssignment a = Assignment({2, 1}, 1, 0);
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 0)), "s0r0");
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 1)), "s0r1");
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 2)), "none");
  // Each of stage 0's replicas takes gradients from it, and only from it.
  a = Assignment({2, 1}, 0, 1);
  EXPECT_EQ(Name(AssignedNeighbour(a, 1, 0)), "s1r0");
  EXPECT_EQ(Name(AssignedNeighbour(a, 1, 1)), "none");
  // [1, 4] then [4, 2]: a replica of stage 1 (micro-batch 2) exchanges with stage 0's one
  // replica and with replica 1 of stage 2 (micro-batches 2 and 3).
  a = Assignment({1, 4, 2}, 1, 2);
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 0)), "s0r0");
  EXPECT_EQ(Name(AssignedNeighbour(a, 2, 1)), "s2r1");
  EXPECT_EQ(Name(AssignedNeighbour(a, 2, 0)), "none");
}

// An assignment without the lists (from a coordinator before them) names the neighbour of equal
// counts in prev and next.
TEST(AssignedNeighbour, WithoutTheListsPrevAndNext) {
  v1::StageAssignment a = Assignment({2, 2}, 1, 1);
  a.clear_prev_replicas();
  a.mutable_prev()->set_name("prev");
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 1)), "prev");
  EXPECT_EQ(Name(AssignedNeighbour(a, 0, 0)), "none");
}

}  // namespace
}  // namespace longhaul::worker
