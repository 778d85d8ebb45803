#include "stage_runtime/pipeline.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "stage_runtime/checkpoint.h"

namespace longhaul::stage_runtime {
namespace {

constexpr double kEquivalenceRelTolerance = 1e-5;  // issue: per-step losses within 1e-5

PipelineOptions Small(int stages, Schedule s) {
  PipelineOptions o;
  o.model = {/*layers=*/4, /*hidden=*/64, /*heads=*/4, /*context=*/32, /*vocab=*/256};
  o.stages = stages;
  o.micro_batches = 4;
  o.micro_batch_size = 4;
  o.schedule = s;
  o.optimizer.warmup_steps = 5;
  o.optimizer.total_steps = 40;
  o.seed = 3;
  return o;
}

const TextDataset& Data() {
  static const TextDataset* d = [] {
    auto r = TextDataset::DefaultCorpus();
    EXPECT_TRUE(r.ok()) << r.status();
    return new TextDataset(std::move(*r));
  }();
  return *d;
}

std::vector<Batch> Batches(const PipelineOptions& o, int64_t step) {
  std::vector<Batch> b;
  for (int m = 0; m < o.micro_batches; ++m) {
    b.push_back(Data().Sample(Split::kTrain, o.seed, step, m, o.micro_batch_size, o.model.context));
  }
  return b;
}

std::vector<double> Train(InProcessPipeline& p, const PipelineOptions& o, int64_t from, int64_t to) {
  std::vector<double> losses;
  for (int64_t s = from; s < to; ++s) {
    auto r = p.TrainStep(Batches(o, s));
    EXPECT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
  }
  return losses;
}

std::unique_ptr<InProcessPipeline> Make(const PipelineOptions& o) {
  auto p = InProcessPipeline::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

TEST(Schedules, EveryMicroBatchForwardThenBackwardOnce) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B}) {
    for (int S : {1, 2, 4}) {
      for (int M : {1, 3, 8}) {
        for (int st = 0; st < S; ++st) {
          auto ops = StageSchedule(s, st, S, M);
          ASSERT_EQ(ops.size(), 2u * M);
          std::vector<int> f(M, -1), b(M, -1);
          for (size_t i = 0; i < ops.size(); ++i) (ops[i].forward ? f : b)[ops[i].micro_batch] = static_cast<int>(i);
          for (int m = 0; m < M; ++m) ASSERT_TRUE(f[m] >= 0 && b[m] > f[m]);
        }
      }
    }
  }
}

TEST(Pipeline, FourStagesMatchTheUnpartitionedModel) {
  const auto ref_opt = Small(1, Schedule::kGPipe);
  auto ref = Make(ref_opt);
  const std::vector<double> expect = Train(*ref, ref_opt, 0, 20);
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B}) {
    const auto o = Small(4, s);
    auto p = Make(o);
    const std::vector<double> got = Train(*p, o, 0, 20);
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_LT(std::fabs(got[i] - expect[i]) / expect[i], kEquivalenceRelTolerance)
          << "step " << i << " schedule " << static_cast<int>(s) << ": " << got[i] << " vs " << expect[i];
    }
    EXPECT_LT(got.back(), got.front()) << "loss did not fall";
    EXPECT_EQ(p->forward_links()[0].raw_bytes, p->forward_links()[0].wire_bytes - 20 * 4 * (40 + 24));
  }
}

// bf16 compute (MixedLinear's linear layers, float32 residual stream and links): four stages give
// the unpartitioned model's losses, and they fall.
TEST(Pipeline, Bf16FourStagesMatchTheUnpartitionedModel) {
  auto ref_opt = Small(1, Schedule::kGPipe);
  ref_opt.precision = Precision::kBf16;
  auto ref = Make(ref_opt);
  const std::vector<double> expect = Train(*ref, ref_opt, 0, 15);
  auto o = Small(4, Schedule::k1F1B);
  o.precision = Precision::kBf16;
  auto p = Make(o);
  const std::vector<double> got = Train(*p, o, 0, 15);
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    EXPECT_LT(std::fabs(got[i] - expect[i]) / expect[i], kEquivalenceRelTolerance) << "step " << i << ": " << got[i]
                                                                                   << " vs " << expect[i];
  }
  EXPECT_LT(got.back(), got.front() - 0.5) << "loss did not fall";
}

TEST(Pipeline, OneFOneBStoresFewerActivations) {
  auto og = Small(4, Schedule::kGPipe), of = Small(4, Schedule::k1F1B);
  og.micro_batches = of.micro_batches = 8;
  auto g = Make(og), f = Make(of);
  Train(*g, og, 0, 1);
  Train(*f, of, 0, 1);
  // GPipe's last stage runs a backward whenever no activation waits (StageLoop), so how many it
  // holds at once depends on when its inputs arrive: at most all of them.
  const std::vector<int64_t> gpipe = g->PeakStoredActivations();
  ASSERT_EQ(gpipe.size(), 4u);
  EXPECT_EQ(std::vector<int64_t>(gpipe.begin(), gpipe.end() - 1), (std::vector<int64_t>{8, 8, 8}));
  EXPECT_GE(gpipe.back(), 1);
  EXPECT_LE(gpipe.back(), 8);
  EXPECT_EQ(f->PeakStoredActivations(), (std::vector<int64_t>{4, 3, 2, 1}));
}

TEST(Pipeline, CompressedLinksCountBytesAndError) {
  auto o = Small(2, Schedule::k1F1B);
  o.forward_codec = "tahquant";
  o.backward_codec = "int8";
  auto p = Make(o);
  const auto losses = Train(*p, o, 0, 10);
  const LinkStats& f = p->forward_links()[0];
  const LinkStats& b = p->backward_links()[0];
  EXPECT_EQ(f.frames, 40);
  EXPECT_LT(f.wire_bytes * 6, f.raw_bytes);  // > 6x smaller than fp32
  EXPECT_GT(f.mean_rel_error(), 0.0);
  EXPECT_LT(f.mean_rel_error(), 0.2);
  EXPECT_LT(b.wire_bytes * 3, b.raw_bytes);
  EXPECT_LT(losses.back(), losses.front());
}

TEST(Checkpoint, ResumeContinuesExactly) {
  const auto o = Small(4, Schedule::k1F1B);
  const std::string dir = ::testing::TempDir() + "/lh_ckpt_resume";
  auto a = Make(o);
  Train(*a, o, 0, 5);
  ASSERT_TRUE(a->SaveCheckpoint(dir).ok());
  const auto expect = Train(*a, o, 5, 10);
  auto b = Make(o);  // fresh executors, as in a new process
  ASSERT_TRUE(b->LoadCheckpoint(dir).ok());
  EXPECT_EQ(b->step(), 5);
  const auto got = Train(*b, o, 5, 10);
  EXPECT_EQ(got, expect);  // bit-identical
}

// A data-parallel synchronisation's own state (a sharded optimizer's shard) is saved in the stage's
// checkpoint and given back on load; a load that does not ask for it ignores it, and the model and
// optimizer load as without it.
TEST(Checkpoint, SyncStateTravelsWithTheStage) {
  const auto o = Small(2, Schedule::kGPipe);
  const std::string path = ::testing::TempDir() + "/lh_ckpt_sync.safetensors";
  auto a = Make(o);
  Train(*a, o, 0, 2);
  TensorFile sync;
  sync.tensors["main"] = torch::arange(10, torch::kFloat32);
  sync.tensors["exp_avg"] = torch::full({10}, 0.5f);
  sync.metadata["rank"] = "1";
  ASSERT_TRUE(a->stage(0).SaveCheckpoint(path, &sync).ok());
  absl::StatusOr<TensorFile> raw = ReadSafetensors(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->tensors.count("__optim__.dp.main"), 1u);  // hf export skips "__optim__." tensors
  EXPECT_EQ(raw->metadata.at("dp.rank"), "1");

  auto b = Make(o);
  TensorFile got;
  ASSERT_TRUE(b->stage(0).LoadCheckpoint(path, &got).ok());
  EXPECT_EQ(b->stage(0).step(), 2);
  ASSERT_EQ(got.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(got.tensors.at("main"), sync.tensors.at("main")));
  EXPECT_TRUE(torch::equal(got.tensors.at("exp_avg"), sync.tensors.at("exp_avg")));
  EXPECT_EQ(got.metadata, (std::map<std::string, std::string>{{"rank", "1"}}));
  auto c = Make(o);
  ASSERT_TRUE(c->stage(0).LoadCheckpoint(path).ok());
  for (size_t i = 0; i < b->stage(0).parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(b->stage(0).parameters()[i].second, c->stage(0).parameters()[i].second));
  }
  // Without sync state the file holds only the stage's own tensors.
  ASSERT_TRUE(a->stage(0).SaveCheckpoint(path).ok());
  ASSERT_TRUE(b->stage(0).LoadCheckpoint(path, &got).ok());
  EXPECT_TRUE(got.tensors.empty());
  EXPECT_TRUE(got.metadata.empty());
}

class MalformedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    o_ = Small(2, Schedule::kGPipe);
    p_ = Make(o_);
    // One directory per test: ctest runs this fixture's tests as parallel processes.
    dir_ = ::testing::TempDir() + "/lh_ckpt_bad-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(p_->SaveCheckpoint(dir_).ok());
    path_ = dir_ + "/stage-0.safetensors";
    std::ifstream in(path_, std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
  }
  void Write(const std::string& b) { std::ofstream(path_, std::ios::binary | std::ios::trunc) << b; }
  void ExpectError(const std::string& words) {
    absl::Status s = p_->LoadCheckpoint(dir_);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  }
  PipelineOptions o_;
  std::unique_ptr<InProcessPipeline> p_;
  std::string dir_, path_, bytes_;
};

TEST_F(MalformedCheckpoint, Truncated) {
  Write(bytes_.substr(0, bytes_.size() - 100));
  ExpectError("truncated");
  Write(bytes_.substr(0, 5));
  ExpectError("truncated");
}

TEST_F(MalformedCheckpoint, WrongHeader) {
  std::string b = bytes_;
  b[9] = '#';  // JSON syntax error
  Write(b);
  ExpectError("not valid JSON");
  b = bytes_;
  b[0] = '\xff';
  b[7] = '\x7f';  // absurd header length
  Write(b);
  ExpectError("header length");
}

TEST_F(MalformedCheckpoint, ShapeMismatch) {
  absl::StatusOr<TensorFile> read = ReadSafetensors(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  TensorFile f = *std::move(read);
  f.tensors["wte.weight"] = torch::zeros({3, 3});
  ASSERT_TRUE(WriteSafetensors(path_, f).ok());
  ExpectError("wte.weight has shape");
}

TEST_F(MalformedCheckpoint, MissingFile) {
  std::filesystem::remove(path_);
  ExpectError("cannot open");
}

// bf16 compute (matrix products and attention in bfloat16, float32 master weights) trains; on the
// GPU the same is tested by tests/gpu.
TEST(Precision, Bf16Trains) {
  PipelineOptions o = Small(2, Schedule::k1F1B);
  o.precision = Precision::kBf16;
  auto p = Make(o);
  const std::vector<double> l = Train(*p, o, 0, 20);
  double head = 0, tail = 0;
  for (int i = 0; i < 4; ++i) head += l[i] / 4, tail += l[16 + i] / 4;
  EXPECT_LT(tail, head - 0.3) << "first 4 steps " << head << ", last 4 " << tail;
  for (const auto& kv : p->stage(0).model()->named_parameters()) EXPECT_EQ(kv.value().scalar_type(), torch::kFloat32);
  EXPECT_TRUE(ParsePrecision("fp16").status().message().find("fp32 or bf16") != std::string::npos);
  EXPECT_FALSE(ParseDevice("tpu:0").ok());
}

}  // namespace
}  // namespace longhaul::stage_runtime
