#include "coordinator/job_spec.h"

#include <gtest/gtest.h>

namespace longhaul::coordinator {
namespace {

TEST(JobSpecTest, EmptyMappingGivesDefaults) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec("name: x\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->stages(), 4);
  EXPECT_EQ(s->forward_codec(), "tahquant");
  EXPECT_EQ(s->backward_codec(), "int8");
  EXPECT_EQ(s->schedule(), "1f1b");
  EXPECT_EQ(s->steps(), 300);
  EXPECT_DOUBLE_EQ(s->optimizer().lr(), 3e-3);
}

TEST(JobSpecTest, ReadsEveryField) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(R"(
name: full
model: {layers: 6, hidden: 96, heads: 3, context: 48, vocab: 256}
stages: 3
schedule: gpipe
micro_batches: 6
micro_batch_size: 2
codecs: {forward: "int4:g=32", backward: fp16}
optimizer: {name: adamw, lr: 0.01, min_lr: 0.001, warmup_steps: 3, beta1: 0.8, beta2: 0.9, eps: 1.0e-6,
            weight_decay: 0.0, clip_norm: 0}
steps: 12
seed: 99
checkpoint: {interval: 4, dir: /tmp/ck}
data: {corpus: /tmp/corpus, val_fraction: 0.2}
links: {rate_mbit: 50.5, between_regions_mbit: 10, burst_bytes: 4096, streams: 2, codec_device: cpu}
codec_threads: 2
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name(), "full");
  EXPECT_EQ(s->model().layers(), 6);
  EXPECT_EQ(s->model().heads(), 3);
  EXPECT_EQ(s->stages(), 3);
  EXPECT_EQ(s->schedule(), "gpipe");
  EXPECT_EQ(s->micro_batches(), 6);
  EXPECT_EQ(s->forward_codec(), "int4:g=32");
  EXPECT_EQ(s->backward_codec(), "fp16");
  EXPECT_DOUBLE_EQ(s->optimizer().beta1(), 0.8);
  EXPECT_DOUBLE_EQ(s->optimizer().clip_norm(), 0);
  EXPECT_EQ(s->steps(), 12);
  EXPECT_EQ(s->seed(), 99u);
  EXPECT_EQ(s->checkpoint_interval(), 4);
  EXPECT_EQ(s->checkpoint_dir(), "/tmp/ck");
  EXPECT_EQ(s->data_dir(), "/tmp/corpus");
  EXPECT_DOUBLE_EQ(s->links().rate_mbit(), 50.5);
  EXPECT_DOUBLE_EQ(s->links().between_regions_mbit(), 10);
  EXPECT_EQ(s->links().burst_bytes(), 4096);
  EXPECT_EQ(s->links().streams(), 2);
  EXPECT_EQ(s->links().codec_device(), "cpu");
  EXPECT_EQ(s->codec_threads(), 2);
}

TEST(JobSpecTest, ListsEveryProblem) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(R"(
model: {layers: 2, hidden: 100, heads: 3, vocab: 100}
stages: 3
schedule: round-robin
micro_batches: many
codecs: {forward: "tahquant:g=5", backward: zstd}
optimizer: {name: sgd, lr: -1}
steps: 0
checkpoint: {interval: -2}
links: {rate_mbit: -3, between_regions_mbit: -1, pace_mbit: -2, streams: 9, codec_device: tpu}
colour: blue
)");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.status().message());
  for (const char* want :
       {"model.hidden: 100 is not divisible by model.heads", "model.vocab", "stages: 3 stages need at least",
        "schedule: \"round-robin\"", "micro_batches (line 5): \"many\" is not an integer", "codecs.forward",
        "codecs.backward", "optimizer.name", "optimizer.lr", "steps: 0", "checkpoint.interval", "links.rate_mbit",
        "links.between_regions_mbit", "links.pace_mbit: -2", "links.streams", "links.codec_device: \"tpu\" is not auto, cpu or gpu", "colour (line 11): unknown key"}) {
    EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << m;
  }
}

TEST(JobSpecTest, PaceIsForLinksWithoutAnEmulatedRate) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec("links: {pace_mbit: 281.5}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->links().pace_mbit(), 281.5);
  for (const char* emulation : {"rate_mbit: 100", "delay_ms: 20", "jitter_ms: 0", "loss: 0.01"}) {
    s = ParseJobSpec(absl::StrCat("links: {", emulation, ", pace_mbit: 90}\n"));
    if (std::string(emulation) == "jitter_ms: 0") {  // zero emulates nothing
      EXPECT_TRUE(s.ok()) << s.status();
      continue;
    }
    ASSERT_FALSE(s.ok()) << emulation;
    EXPECT_NE(std::string(s.status().message()).find("links.pace_mbit: 90 paces real links"), std::string::npos)
        << s.status();
  }
}

TEST(JobSpecTest, PresetsPrecisionAndTokenData) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(R"(
model: {preset: gpt2-medium, context: 256}
stages: 4
precision: bf16
data: {format: tokens-u16, corpus: /data/owt}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model().preset(), "gpt2-medium");
  EXPECT_EQ(s->model().layers(), 24);
  EXPECT_EQ(s->model().hidden(), 1024);
  EXPECT_EQ(s->model().heads(), 16);
  EXPECT_EQ(s->model().context(), 256);  // given next to the preset: overrides it
  EXPECT_EQ(s->model().vocab(), 50257);
  EXPECT_EQ(s->precision(), "bf16");
  EXPECT_EQ(s->data_format(), "tokens-u16");
  // Defaults: fp32, byte-level text.
  absl::StatusOr<v1::JobSpec> d = ParseJobSpec("name: plain\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->precision(), "fp32");
  EXPECT_EQ(d->data_format(), "text");

  absl::StatusOr<v1::JobSpec> bad = ParseJobSpec(R"(
model: {preset: gpt5}
precision: fp8
data: {format: parquet}
)");
  ASSERT_FALSE(bad.ok());
  const std::string m(bad.status().message());
  for (const char* want : {"model.preset: \"gpt5\" is not one of gpt2-small", "precision: \"fp8\"",
                           "data.format: \"parquet\""}) {
    EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << m;
  }
  // Token data: the vocab is the tokenizer's (up to 65536 for uint16 tokens).
  EXPECT_FALSE(ParseJobSpec("model: {vocab: 70000}\ndata: {format: tokens-u16, corpus: /d}\n").ok());
  EXPECT_TRUE(ParseJobSpec("model: {vocab: 8000}\ndata: {format: tokens-u16, corpus: /d}\n").ok());
}

TEST(JobSpecTest, SyntaxErrorsAndShapesAreClear) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec("model: {layers: 4\nstages: [");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not valid YAML: line"), std::string::npos) << s.status();
  s = ParseJobSpec("- a\n- b\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("must be a YAML mapping"), std::string::npos);
  s = ParseJobSpec("model: 4\ncodecs: {forward: [1, 2]}\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("model (line 1): must be a mapping"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("codecs.forward (line 2): must be a single value"), std::string::npos);
  s = ParseJobSpec(std::string(kMaxSpecBytes + 1, '#'));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("the limit is"), std::string::npos);
}

// links.codec_device: auto by default; auto, cpu and gpu accepted (also in a spec built in code,
// where "" means auto); anything else named.
TEST(JobSpecTest, CodecDevice) {
  absl::StatusOr<v1::JobSpec> d = ParseJobSpec("name: x\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->links().codec_device(), "auto");
  for (const char* v : {"auto", "cpu", "gpu"}) {
    absl::StatusOr<v1::JobSpec> s = ParseJobSpec(std::string("links: {codec_device: ") + v + "}\n");
    ASSERT_TRUE(s.ok()) << v << ": " << s.status();
    EXPECT_EQ(s->links().codec_device(), v);
  }
  v1::JobSpec built = DefaultJobSpec();
  built.mutable_links()->set_codec_device("");
  EXPECT_TRUE(ValidateJobSpec(built).ok());
  for (const char* v : {"GPU", "cuda", "cuda:0", "1"}) {
    absl::StatusOr<v1::JobSpec> s = ParseJobSpec(std::string("links: {codec_device: \"") + v + "\"}\n");
    ASSERT_FALSE(s.ok()) << v;
    EXPECT_NE(s.status().message().find(std::string("links.codec_device: \"") + v + "\" is not auto, cpu or gpu"),
              std::string::npos)
        << s.status();
  }
  absl::StatusOr<v1::JobSpec> m = ParseJobSpec("links: {codec_device: [gpu]}\n");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("links.codec_device (line 1): must be a single value"), std::string::npos)
      << m.status();
}

TEST(JobSpecTest, StepsOverrideApplies) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec("steps: 0\n", 60);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->steps(), 60);
}

// The progress watchdog's and the straggler flag's settings (docs/recovery.md).
TEST(JobSpecTest, WatchdogSettings) {
  absl::StatusOr<v1::JobSpec> d = ParseJobSpec("name: x\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->recovery().progress_timeout_factor(), 10);
  EXPECT_EQ(d->recovery().progress_timeout_min_seconds(), 60);
  EXPECT_EQ(d->recovery().startup_timeout_seconds(), 1800);
  EXPECT_EQ(d->recovery().straggler_factor(), 3);
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(
      "recovery: {progress_timeout_factor: 4, progress_timeout_min: 90s, startup_timeout: 1h, straggler_factor: 2.5}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->recovery().progress_timeout_factor(), 4);
  EXPECT_EQ(s->recovery().progress_timeout_min_seconds(), 90);
  EXPECT_EQ(s->recovery().startup_timeout_seconds(), 3600);
  EXPECT_EQ(s->recovery().straggler_factor(), 2.5);
  // 0 turns the watchdog and the flag off; a plain number is seconds.
  absl::StatusOr<v1::JobSpec> off =
      ParseJobSpec("recovery: {progress_timeout_factor: 0, straggler_factor: 0, progress_timeout_min: 5}\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->recovery().progress_timeout_factor(), 0);
  EXPECT_EQ(off->recovery().progress_timeout_min_seconds(), 5);
  absl::StatusOr<v1::JobSpec> bad = ParseJobSpec(
      "recovery: {progress_timeout_factor: 1.5, progress_timeout_min: 0.5s, startup_timeout: never, "
      "straggler_factor: 1}\n");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  for (const char* want : {"recovery.progress_timeout_factor: 1.5 must be 0 (no watchdog) or in [2, 10000]",
                           "recovery.progress_timeout_min: 0.5s must be in [1s, 1e7s]",
                           "recovery.startup_timeout: \"never\" is not a duration (0, 90s, 10m)",
                           "recovery.straggler_factor: 1 must be 0 (not flagged) or in (1, 10000]"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << msg;
  }
}

TEST(JobSpecTest, ReplicasAndDataParallel) {
  absl::StatusOr<v1::JobSpec> d = ParseJobSpec("name: x\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->replicas(), 1);
  EXPECT_EQ(d->data_parallel().codec(), "fp32");
  EXPECT_EQ(d->data_parallel().timeout_seconds(), 120);
  EXPECT_EQ(d->data_parallel().weight_bits(), 4);
  EXPECT_EQ(WorkersNeeded(*d), 4);

  absl::StatusOr<v1::JobSpec> s = ParseJobSpec(
      "stages: 2\nmicro_batches: 4\nreplicas: 2\ndata_parallel: {codec: sdp4bit, timeout: 30s, weight_bits: 8}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->replicas(), 2);
  EXPECT_EQ(WorkersNeeded(*s), 4);
  EXPECT_EQ(s->data_parallel().codec(), "sdp4bit");
  EXPECT_EQ(s->data_parallel().timeout_seconds(), 30);
  EXPECT_EQ(s->data_parallel().weight_bits(), 8);

  v1::JobSpec in_code;  // specs built in code leave replicas at 0: one replica
  EXPECT_EQ(StageReplicas(in_code, 0), 1);
  EXPECT_FALSE(HasReplicas(in_code));

  absl::StatusOr<v1::JobSpec> bad = ParseJobSpec(
      "micro_batches: 4\nreplicas: 3\ndata_parallel: {codec: int3, timeout: soon, weight_bits: 2, extra: 1}\n");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  for (const char* want : {"micro_batches: 4 is not a multiple of replicas (3)",
                           "data_parallel.codec: \"int3\" is not fp32, sdp4bit, bitdp1, bitdp2 or zeropp",
                           "data_parallel.timeout: \"soon\" is not a duration", "data_parallel.weight_bits: 2 is not 4 or 8",
                           "data_parallel.extra (line 3): unknown key"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << msg;
  }
  absl::StatusOr<v1::JobSpec> many = ParseJobSpec("replicas: 65\n");
  ASSERT_FALSE(many.ok());
  EXPECT_NE(std::string(many.status().message()).find("replicas: 65 is out of range [1, 64]"), std::string::npos)
      << many.status();
}

// A per-stage list of replica counts (proto/replica_layout.h): its slots, shares and neighbours.
TEST(JobSpecTest, PerStageReplicaList) {
  absl::StatusOr<v1::JobSpec> s = ParseJobSpec("stages: 3\nmicro_batches: 4\nreplicas: [2, 1, 4]\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->replicas(), 0);
  ASSERT_EQ(s->stage_replicas_size(), 3);
  EXPECT_TRUE(HasReplicas(*s));
  EXPECT_TRUE(ReplicaCountsDiffer(*s));
  EXPECT_EQ(WorkersNeeded(*s), 7);
  EXPECT_EQ(MaxReplicas(*s), 4);
  EXPECT_EQ(DescribeStages(*s), "3 stages with replicas [2, 1, 4]");
  EXPECT_EQ(ReplicaMicroBatches(*s, 0), 2);
  EXPECT_EQ(ReplicaMicroBatches(*s, 1), 4);
  EXPECT_EQ(ReplicaMicroBatches(*s, 2), 1);
  // Replica-major: every stage's replica 0, then replica 1 of stages 0 and 2, then 2 and 3 of stage 2.
  const std::vector<ReplicaSlot> slots = ReplicaSlots(*s);
  std::vector<std::pair<int, int>> got;
  for (const ReplicaSlot& r : slots) got.emplace_back(r.stage, r.replica);
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {2, 1}, {2, 2}, {2, 3}}));
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(SlotOf(*s, slots[i].stage, slots[i].replica), static_cast<int>(i));
  }
  EXPECT_EQ(SlotOf(*s, 1, 1), -1);
  EXPECT_EQ(SlotOf(*s, 3, 0), -1);
  // Stage 1's one replica takes micro-batches 0..3: both of stage 0's replicas and all four of stage 2's.
  EXPECT_EQ(ExchangingReplicas(*s, 1, 0, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(ExchangingReplicas(*s, 1, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ExchangingReplicas(*s, 0, 1, 1), (std::vector<int>{0}));
  EXPECT_EQ(ExchangingReplicas(*s, 2, 3, 1), (std::vector<int>{0}));

  absl::StatusOr<v1::JobSpec> equal = ParseJobSpec("stages: 2\nmicro_batches: 4\nreplicas: 2\n");
  ASSERT_TRUE(equal.ok()) << equal.status();
  EXPECT_EQ(DescribeStages(*equal), "2 stages x 2 replicas");
  for (int r = 0; r < 2; ++r) {
    for (int st = 0; st < 2; ++st) EXPECT_EQ(SlotOf(*equal, st, r), r * 2 + st);
    EXPECT_EQ(ExchangingReplicas(*equal, 0, r, 1), (std::vector<int>{r}));
  }

  absl::StatusOr<v1::JobSpec> bad = ParseJobSpec("stages: 3\nmicro_batches: 4\nreplicas: [3, 0, x]\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("replicas (line 3): every entry must be an integer (\"x\" is not)"),
            std::string::npos)
      << bad.status();
  bad = ParseJobSpec("stages: 2\nreplicas: []\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("replicas: an empty list"), std::string::npos) << bad.status();
  bad = ParseJobSpec("stages: 3\nmicro_batches: 4\nreplicas: [3, 0]\n");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  for (const char* want : {"replicas: a list of 2 counts for 3 stages (one per stage)",
                           "micro_batches: 4 is not a multiple of replicas[0] (3)", "replicas[1]: 0 is out of range [1, 64]"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << msg;
  }
}

}  // namespace
}  // namespace longhaul::coordinator
