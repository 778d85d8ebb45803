// The step loop's links and failure handling: InProcessLink (codec round trip, stats, close,
// abort), LinkFan (routing by micro-batch) and StageLoop (out-of-order messages named,
// cancellation wakes a stage blocked on a neighbour). The loop's numerics are covered by
// pipeline_test (in-process == unpartitioned) and tests/integration (multi-process == in-process,
// replica counts per stage == one replica), which both run through StageLoop.
#include "stage_runtime/stage_loop.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "stage_runtime/in_process_link.h"

namespace longhaul::stage_runtime {
namespace {

std::unique_ptr<codec::Codec> Codec(const char* spec) {
  auto c = codec::MakeCodec(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(InProcessLink, CarriesWhatTheCodecDecodesAndCountsFrames) {
  auto fwd = Codec("int8"), bwd = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, fwd.get(), bwd.get(), 4, 1);
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({2, 8, 64});
  ASSERT_TRUE(up->Send(TensorMessage(0, 0, MessageKind::kActivation, x), /*measure_error=*/true).ok());
  absl::StatusOr<LinkMessage> got = down->Receive(absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, MessageKind::kActivation);
  EXPECT_EQ(got->tensor.sizes(), x.sizes());
  const double err = RelativeL2Error(x, got->tensor);
  EXPECT_GT(err, 0.0);  // int8 is lossy ...
  EXPECT_LT(err, 0.02);  // ... but close
  const LinkStats st = up->stats();
  EXPECT_EQ(st.frames, 1);
  EXPECT_EQ(st.raw_bytes, x.numel() * 4);
  EXPECT_LT(st.wire_bytes * 3, st.raw_bytes);
  EXPECT_EQ(st.error_samples, 1);
  EXPECT_DOUBLE_EQ(st.sum_rel_error, err);
  EXPECT_EQ(down->stats().frames, 0);  // counters are per sending direction

  // The other direction, fp32: exact.
  ASSERT_TRUE(down->Send(TensorMessage(0, 0, MessageKind::kGradient, x), false).ok());
  got = up->Receive(absl::Seconds(5));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(torch::equal(got->tensor, x));
  EXPECT_EQ(down->stats().error_samples, 0);
}

TEST(InProcessLink, FinishDrainsThenReportsTheClose) {
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(2, c.get(), c.get(), 4, 1);
  const LinkMessage norm = ValueMessage(0, MessageKind::kNormTotal, 2.5);
  ASSERT_TRUE(up->Send(norm, false).ok());
  ASSERT_TRUE(up->Finish().ok());
  absl::StatusOr<LinkMessage> m = down->Receive(absl::Seconds(5));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->value, 2.5);
  m = down->Receive(absl::Seconds(5));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("stage 2"), std::string::npos) << m.status();
  EXPECT_FALSE(up->Send(norm, false).ok());  // nothing goes out after Finish
}

TEST(InProcessLink, ReceiveTimesOutNamingThePeer) {
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), 4, 1);
  absl::StatusOr<LinkMessage> m = up->Receive(absl::Milliseconds(20));
  ASSERT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
  EXPECT_NE(m.status().message().find("stage 1"), std::string::npos) << m.status();
}

// A replica's micro-batches go to the neighbour replica that takes them, numbered as it numbers them
// (replica counts that differ between stages, link_fan.h).
TEST(LinkFan, RoutesEachMicroBatchToTheReplicaThatTakesIt) {
  auto c = Codec("fp32");
  auto [a, a_far] = InProcessLink::Pair(0, c.get(), c.get(), 4, 1);
  auto [b, b_far] = InProcessLink::Pair(0, c.get(), c.get(), 4, 1);
  // The one replica of a stage taking micro-batches 0..3 from two replicas taking 2 each.
  const LinkFan in({{a.get(), 0, 2}, {b.get(), 2, 2}}, /*first=*/0, /*gradient_scale=*/0.5);
  const std::vector<std::pair<Link*, int>> want = {{a.get(), 0}, {a.get(), 1}, {b.get(), 0}, {b.get(), 1}};
  for (int mb = 0; mb < 4; ++mb) {
    EXPECT_EQ(in.For(mb).link, want[mb].first) << mb;
    EXPECT_EQ(in.For(mb).micro_batch, want[mb].second) << mb;
  }
  EXPECT_EQ(in.For(4).link, nullptr);
  // Replica 1 of the two (its micro-batches 2 and 3) towards the one that takes all four.
  const LinkFan out({{a.get(), 0, 4}}, /*first=*/2, /*gradient_scale=*/2);
  EXPECT_EQ(out.For(0).link, a.get());
  EXPECT_EQ(out.For(0).micro_batch, 2);
  EXPECT_EQ(out.For(1).micro_batch, 3);
  // One link: the same numbering on both ends.
  const LinkFan one(b.get());
  EXPECT_EQ(one.For(3).link, b.get());
  EXPECT_EQ(one.For(3).micro_batch, 3);
}

PipelineOptions TwoStages() {
  PipelineOptions o;
  o.model = {/*layers=*/2, /*hidden=*/32, /*heads=*/2, /*context=*/8, /*vocab=*/256};
  o.stages = 2;
  o.micro_batches = 2;
  o.micro_batch_size = 2;
  return o;
}

std::unique_ptr<StageExecutor> Executor(const PipelineOptions& o, int stage) {
  auto parts = PartitionLayers(o.model.layers, o.stages);
  EXPECT_TRUE(parts.ok());
  StageSpec spec{o.model, (*parts)[stage], stage == 0, stage == o.stages - 1, o.seed, o.micro_batches, o.optimizer};
  auto e = StageExecutor::Create(spec);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

// Forwards to a link. Logs, in call order, what went through it: "A<k>" for micro-batch k's
// activation received, "G<k>" for its gradient sent; and sleeps `send_delay` before sending each
// activation (a slow link). Each side is used by one stage's thread only.
class RecordingLink : public Link {
 public:
  explicit RecordingLink(Link* inner, absl::Duration send_delay = absl::ZeroDuration())
      : inner_(inner), send_delay_(send_delay) {}
  absl::Status Send(LinkMessage m, bool measure_error) override {
    if (m.kind == MessageKind::kGradient) log.push_back(absl::StrCat("G", m.micro_batch));
    if (m.kind == MessageKind::kActivation) absl::SleepFor(send_delay_);
    return inner_->Send(std::move(m), measure_error);
  }
  absl::StatusOr<LinkMessage> Receive(absl::Duration timeout) override {
    absl::StatusOr<LinkMessage> m = inner_->Receive(timeout);
    if (m.ok() && m->kind == MessageKind::kActivation) log.push_back(absl::StrCat("A", m->micro_batch));
    return m;
  }
  absl::Status Finish() override { return inner_->Finish(); }
  void Abort(absl::Status why) override { inner_->Abort(why); }
  LinkStats stats() override { return inner_->stats(); }
  absl::Duration TakeSendWait() override { return inner_->TakeSendWait(); }
  const std::string& peer() const override { return inner_->peer(); }

  std::vector<std::string> log;

 private:
  Link* const inner_;
  const absl::Duration send_delay_;
};

struct TwoStageRun {
  std::vector<std::string> log;  // the last stage's side of the link, first step
  int64_t peak_stored_last = 0;
  std::vector<double> losses;    // per step: the second's depends on the first's gradients
};

// Two steps of two stages, 3 micro-batches, stage 0's activations sent `delay` apart.
TwoStageRun RunTwoStages(Schedule schedule, absl::Duration delay) {
  PipelineOptions o = TwoStages();
  o.micro_batches = 3;
  o.schedule = schedule;
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), LinkCapacity(o), 1);
  auto exec0 = Executor(o, 0), exec1 = Executor(o, 1);
  RecordingLink slow_up(up.get(), delay), recorded(down.get());
  StageLoop first(o, 0, exec0.get(), nullptr, &slow_up), last(o, 1, exec1.get(), &recorded, nullptr);
  std::vector<Batch> batches(3);
  for (int i = 0; i < 3; ++i) {
    batches[i].tokens = torch::full({2, 8}, i, torch::kLong);
    batches[i].labels = torch::full({2, 8}, i + 1, torch::kLong);
  }
  TwoStageRun run;
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<StepResult> r0, r1;
    std::thread t0([&] { r0 = first.Step(batches); });
    r1 = last.Step(batches);
    t0.join();
    EXPECT_TRUE(r0.ok()) << r0.status();
    EXPECT_TRUE(r1.ok()) << r1.status();
    run.losses.push_back(r1.ok() ? r1->loss : 0.0);
    if (step == 0) {
      run.log = recorded.log;
      run.peak_stored_last = exec1->peak_stored_activations();
    }
  }
  return run;
}

// GPipe's last stage: what the two stages send is GPipe's order whether the activations arrive at
// once or slowly, since the last stage holds its gradients until the last activation has arrived
// (stage 0's download is still busy with them until then); with a slow link it runs a backward
// while it waits for the next activation, one activation stored at a time. The arithmetic is the
// same either way.
TEST(StageLoop, GPipesLastStageRunsByItsInputsAndHoldsItsGradientsUntilTheLast) {
  const TwoStageRun fast = RunTwoStages(Schedule::kGPipe, absl::ZeroDuration());
  const TwoStageRun slow = RunTwoStages(Schedule::kGPipe, absl::Milliseconds(200));
  const std::vector<std::string> gpipe = {"A0", "A1", "A2", "G0", "G1", "G2"};
  EXPECT_EQ(fast.log, gpipe);
  EXPECT_EQ(slow.log, gpipe);
  EXPECT_EQ(slow.peak_stored_last, 1);
  ASSERT_EQ(fast.losses.size(), 2u);
  EXPECT_GT(fast.losses[0], 0.0);
  EXPECT_NE(fast.losses[1], fast.losses[0]);
  EXPECT_EQ(slow.losses, fast.losses);  // bit for bit, the second step's included
  // 1F1B's last stage sends each gradient as soon as it is computed.
  const TwoStageRun onefoneb = RunTwoStages(Schedule::k1F1B, absl::Milliseconds(50));
  EXPECT_EQ(onefoneb.log, (std::vector<std::string>{"A0", "G0", "A1", "G1", "A2", "G2"}));
  EXPECT_EQ(onefoneb.losses, fast.losses);
}

TEST(StageLoop, AnOutOfOrderMessageIsDataLossNamingThePeer) {
  const PipelineOptions o = TwoStages();
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), LinkCapacity(o), 1);
  auto exec = Executor(o, 1);
  StageLoop loop(o, 1, exec.get(), down.get(), nullptr);
  // Stage 1 expects micro-batch 0's activation of step 0; stage "0" sends micro-batch 1's.
  ASSERT_TRUE(up->Send(TensorMessage(0, 1, MessageKind::kActivation, torch::zeros({2, 8, 32})), false).ok());
  std::vector<Batch> batches(2);
  for (Batch& b : batches) b.labels = torch::zeros({2, 8}, torch::kLong);
  absl::StatusOr<StepResult> r = loop.Step(batches);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("stage 0"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("micro-batch 1"), std::string::npos) << r.status();
}

TEST(StageLoop, CancelWakesAStageWaitingForItsNeighbour) {
  const PipelineOptions o = TwoStages();
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), LinkCapacity(o), 1);
  auto exec = Executor(o, 1);
  StageLoop loop(o, 1, exec.get(), down.get(), nullptr);
  std::vector<Batch> batches(2);
  for (Batch& b : batches) b.labels = torch::zeros({2, 8}, torch::kLong);
  absl::StatusOr<StepResult> r;
  std::thread t([&] { r = loop.Step(batches); });  // blocks: stage 0 never sends
  absl::SleepFor(absl::Milliseconds(50));
  loop.Cancel(absl::AbortedError("worker shutting down"));
  t.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("worker shutting down"), std::string::npos) << r.status();
}

TEST(StageLoop, WrongNumberOfBatchesIsRejected) {
  const PipelineOptions o = TwoStages();
  auto exec = Executor(o, 0);
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), LinkCapacity(o), 1);
  StageLoop loop(o, 0, exec.get(), nullptr, up.get());
  EXPECT_EQ(loop.Step({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StageLoop, CheckpointsAtTheIntervalAndAtTheEnd) {
  PipelineOptions o = TwoStages();
  o.stages = 1;
  auto exec = Executor(o, 0);
  const std::string path = ::testing::TempDir() + "/loop-ck.safetensors";
  std::remove(path.c_str());
  StageLoop loop(o, 0, exec.get(), nullptr, nullptr, CheckpointPolicy{path, /*interval=*/2, /*total_steps=*/3});
  std::vector<Batch> batches(2);
  for (Batch& b : batches) {
    b.tokens = torch::zeros({2, 8}, torch::kLong);
    b.labels = torch::ones({2, 8}, torch::kLong);
  }
  std::vector<bool> saved;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StepResult> r = loop.Step(batches);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, i);
    EXPECT_GT(r->loss, 0.0);
    saved.push_back(r->checkpointed);
  }
  EXPECT_EQ(saved, (std::vector<bool>{false, true, true}));  // after steps 2 (interval) and 3 (end)
  EXPECT_TRUE(std::filesystem::exists(path));
}

// Compute timing (StepResult::compute, for the worker's metrics): every phase is timed, the phases
// fit in the step, and time spent waiting for a neighbour is not counted as compute.
TEST(StageLoop, TimesForwardBackwardAndOptimizerApartFromWaiting) {
  const PipelineOptions o = TwoStages();
  auto c = Codec("fp32");
  auto [up, down] = InProcessLink::Pair(0, c.get(), c.get(), LinkCapacity(o), 1);
  auto exec0 = Executor(o, 0), exec1 = Executor(o, 1);
  StageLoop first(o, 0, exec0.get(), nullptr, up.get()), last(o, 1, exec1.get(), down.get(), nullptr);
  std::vector<Batch> batches(2);
  for (Batch& b : batches) {
    b.tokens = torch::zeros({2, 8}, torch::kLong);
    b.labels = torch::ones({2, 8}, torch::kLong);
  }
  constexpr absl::Duration kLate = absl::Milliseconds(200);  // stage 0 starts this late
  absl::StatusOr<StepResult> r0, r1;
  absl::Duration took0, took1;
  std::thread t0([&] {
    absl::SleepFor(kLate);
    const absl::Time start = absl::Now();
    r0 = first.Step(batches);
    took0 = absl::Now() - start;
  });
  const absl::Time start = absl::Now();
  r1 = last.Step(batches);
  took1 = absl::Now() - start;
  t0.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  for (const auto& [r, took] : {std::pair{&*r0, took0}, std::pair{&*r1, took1}}) {
    SCOPED_TRACE(absl::StrCat("stage with step time ", absl::FormatDuration(took)));
    EXPECT_GT(r->compute.forward, absl::ZeroDuration());
    EXPECT_GT(r->compute.backward, absl::ZeroDuration());
    EXPECT_GT(r->compute.optimizer, absl::ZeroDuration());
    // Disjoint parts of the step on the CPU: together no longer than it.
    EXPECT_LE(r->compute.forward + r->compute.backward + r->compute.optimizer + r->receive_wait, took);
  }
  // Stage 1 waited for the late stage 0: that is receive wait, not compute.
  EXPECT_GE(r1->receive_wait, kLate - absl::Milliseconds(20));
  EXPECT_LT(r1->compute.forward + r1->compute.backward + r1->compute.optimizer, took1 - kLate + absl::Milliseconds(20));
  // Taken once: the next step starts from zero.
  EXPECT_EQ(exec1->TakeComputeTimes().forward, absl::ZeroDuration());
}

}  // namespace
}  // namespace longhaul::stage_runtime
