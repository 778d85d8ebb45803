// Inbox on its own: per-stream queues taken in turn, per-stream close, shares of the capacity,
// cancellation and timeouts.
#include "worker/inbox.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

namespace longhaul::worker {
namespace {

stage_runtime::LinkMessage Message(int micro_batch) {
  stage_runtime::LinkMessage m;
  m.micro_batch = micro_batch;
  return m;
}

// Stripes are taken in turn: a message waiting on stream 1 is not popped before stream 0's; a
// stream that closed cleanly fails the Pop that needs a message from it, after the ones queued
// before.
TEST(InboxTest, StripesArePoppedInTurnAndCloseSeparately) {
  Inbox in(4, "stage 0 (test)");
  ASSERT_TRUE(in.SetStripes(2));
  EXPECT_FALSE(in.SetStripes(3));
  EXPECT_TRUE(in.SetStripes(2));
  ASSERT_TRUE(in.Push(Message(1), 1).ok());
  EXPECT_FALSE(in.Pop(absl::Milliseconds(20)).ok());  // message 0 (stream 0) has not come
  ASSERT_TRUE(in.Push(Message(0), 0).ok());
  ASSERT_TRUE(in.Push(Message(2), 0).ok());
  in.Close(absl::OkStatus(), 1);
  for (int want : {0, 1, 2}) {
    auto f = in.Pop(absl::Seconds(1));
    ASSERT_TRUE(f.ok()) << want << ": " << f.status();
    EXPECT_EQ(f->micro_batch, want);
  }
  auto end = in.Pop(absl::Seconds(1));  // message 3 would come on the closed stream 1
  ASSERT_FALSE(end.ok());
  EXPECT_NE(end.status().message().find("closed"), std::string::npos) << end.status();
}

TEST(InboxTest, StripeCountsOutOfRangeAreRefused) {
  Inbox in(4, "stage 0 (test)");
  EXPECT_FALSE(in.SetStripes(0));
  EXPECT_FALSE(in.SetStripes(kMaxStripes + 1));
  ASSERT_TRUE(in.SetStripes(kMaxStripes));
  absl::Status s = in.Push(Message(0), kMaxStripes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// The compute thread may wait for a link's first message before any of its streams arrived (and
// so before the stripe count is known).
TEST(InboxTest, PopBeforeTheFirstStreamWaitsForIt) {
  Inbox in(4, "stage 0 (test)");
  std::thread stream([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(in.SetStripes(2));
    ASSERT_TRUE(in.Push(Message(0), 0).ok());
  });
  auto f = in.Pop(absl::Seconds(10));
  stream.join();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->micro_batch, 0);
}

// Each stream may fill its share of the capacity (4 over 2 streams: 2 each) and then waits.
TEST(InboxTest, EachStreamFillsOnlyItsShare) {
  Inbox in(4, "stage 0 (test)");
  ASSERT_TRUE(in.SetStripes(2));
  ASSERT_TRUE(in.Push(Message(0), 0).ok());
  ASSERT_TRUE(in.Push(Message(2), 0).ok());
  std::atomic<bool> pushed{false};
  std::thread stream0([&] {
    EXPECT_TRUE(in.Push(Message(4), 0).ok());
    pushed = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(pushed.load());  // stream 0's share is full; stream 1's is not
  ASSERT_TRUE(in.Push(Message(1), 1).ok());
  auto f = in.Pop(absl::Seconds(1));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->micro_batch, 0);
  stream0.join();
  EXPECT_TRUE(pushed.load());
}

TEST(InboxTest, CancelWakesAWaitingPopAndTimeoutNamesThePeer) {
  Inbox in(2, "stage 4 (worker w9 at h:1)");
  auto t = in.Pop(absl::Milliseconds(20));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(t.status().message().find("no frame from stage 4 (worker w9"), std::string::npos) << t.status();
  ASSERT_TRUE(in.SetStripes(1));
  auto t2 = in.Pop(absl::Milliseconds(20));  // now waiting on the stream's queue
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("no frame from stage 4 (worker w9"), std::string::npos) << t2.status();
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    in.Cancel(absl::CancelledError("job cancelled"));
  });
  auto c = in.Pop(absl::Seconds(30));
  canceller.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.status().message(), "job cancelled");
  EXPECT_FALSE(in.Push(Message(0)).ok());
}

// A Push blocked on a full share wakes up when the inbox is cancelled.
TEST(InboxTest, CancelWakesABlockedPush) {
  Inbox in(1, "stage 0 (test)");
  ASSERT_TRUE(in.Push(Message(0)).ok());
  absl::Status blocked;
  std::thread stream([&] { blocked = in.Push(Message(1)); });
  absl::SleepFor(absl::Milliseconds(50));
  in.Cancel(absl::CancelledError("job over"));
  stream.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kCancelled) << blocked;
}

// Close and Cancel before the stripe count is known still apply to the streams that come later.
TEST(InboxTest, CloseBeforeTheFirstStreamApplies) {
  Inbox in(4, "stage 0 (test)");
  in.Close(absl::DataLossError("bad frame from stage 0"));
  ASSERT_TRUE(in.SetStripes(2));
  auto f = in.Pop(absl::Seconds(1));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
}

}  // namespace
}  // namespace longhaul::worker
