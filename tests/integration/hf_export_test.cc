// The Hugging Face export end to end (ctest label: integration): a short job on a local cluster
// (real coordinator and worker processes) writes every stage's checkpoint; `longhaulctl export
// --format=hf` gathers them into one directory; Python's transformers (the virtual environment
// tools/setup.sh makes in .deps/venv) loads it, and its logits must match the ones our model
// computes from the same checkpoints. Skipped, saying why, only when that environment is missing.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "stage_runtime/checkpoint.h"
#include "stage_runtime/model.h"
#include "tools/cluster/local_cluster.h"

namespace longhaul::cluster {
namespace {

namespace fs = std::filesystem;
namespace sr = stage_runtime;

// 3 layers on 2 stages: blocks {0, 1} and {2}, so the export joins uneven ranges.
constexpr int kLayers = 3, kHidden = 64, kHeads = 4, kContext = 32, kVocab = 256;

std::string Spec() {
  return absl::StrCat("name: hf\nmodel: {layers: ", kLayers, ", hidden: ", kHidden, ", heads: ", kHeads,
                      ", context: ", kContext, ", vocab: ", kVocab, R"(}
stages: 2
micro_batches: 2
micro_batch_size: 4
codecs: {forward: fp32, backward: fp32}
optimizer: {lr: 1.0e-2, warmup_steps: 1}
steps: 4
seed: 3
)");
}

std::string Python() {
  if (const char* p = std::getenv("LONGHAUL_PYTHON")) return p;
  return LONGHAUL_SOURCE_DIR "/.deps/venv/bin/python";
}

std::string Ctl(const Cluster& c) { return absl::StrCat(Cluster::Bin("longhaulctl"), " --coordinator=", c.address()); }

class HfExportTest : public ::testing::Test {
 protected:
  // One job for the whole suite (ctest runs each test in its own process, so each runs it once).
  static void SetUpTestSuite() {
    cluster_ = new Cluster();
    absl::Status s = cluster_->StartCoordinator();
    // RunningJobIsExportedFromItsLastCheckpoint's checkpoint.dir is outside the workers' data dirs.
    cluster_->SetWorkerFlags({absl::StrCat("--allow-paths=", cluster_->dir())});
    if (s.ok()) s = cluster_->StartWorkers(2);
    absl::StatusOr<uint64_t> job = s.ok() ? cluster_->Submit(Spec()) : absl::StatusOr<uint64_t>(s);
    absl::StatusOr<v1::JobStatus> st = job.ok() ? cluster_->WaitForEnd(*job, absl::Minutes(3)) : job.status();
    if (!st.ok()) {
      setup_error_ = new std::string(st.status().ToString());
    } else if (st->state() != v1::JOB_STATE_SUCCEEDED) {
      setup_error_ = new std::string(absl::StrCat("job ended ", v1::JobState_Name(st->state()), ": ", st->error()));
    } else {
      job_ = new v1::JobStatus(*st);
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete job_;
    delete setup_error_;
  }
  void SetUp() override {
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
    ASSERT_EQ(job_->stages_size(), 2);
    for (const auto& p : job_->stages()) ASSERT_FALSE(p.checkpoint_path().empty());
  }
  void TearDown() override {
    if (HasFailure()) cluster_->DumpLogs();
  }
  static std::string Dir(const std::string& name) { return absl::StrCat(cluster_->dir(), "/", name); }
  static std::pair<int, std::string> Export(const std::string& out, const std::string& extra = "") {
    return Cluster::Run(absl::StrCat(Ctl(*cluster_), " export ", job_->job_id(), " --format=hf --out ", out, extra));
  }

  static Cluster* cluster_;
  static v1::JobStatus* job_;
  static std::string* setup_error_;
};
Cluster* HfExportTest::cluster_ = nullptr;
v1::JobStatus* HfExportTest::job_ = nullptr;
std::string* HfExportTest::setup_error_ = nullptr;

// Our logits for `tokens`, from the stage checkpoints `paths` through our model (the stages chained
// in one process), in float32 as the workers compute.
absl::StatusOr<torch::Tensor> OurLogits(const v1::JobStatus& job, const std::vector<std::string>& paths,
                                        const torch::Tensor& tokens) {
  const sr::GptConfig cfg{kLayers, kHidden, kHeads, kContext, kVocab};
  torch::NoGradGuard no_grad;
  torch::Tensor x = tokens;
  for (int s = 0; s < job.stages_size(); ++s) {
    const v1::StagePlacement& p = job.stages(s);
    sr::GptStage stage(cfg, sr::LayerRange{p.layer_begin(), p.layer_end()}, s == 0, s == job.stages_size() - 1, 1);
    absl::StatusOr<sr::TensorFile> f = sr::ReadSafetensors(paths[s]);
    if (!f.ok()) return f.status();
    for (auto& kv : stage->named_parameters()) {
      auto it = f->tensors.find(kv.key());
      if (it == f->tensors.end()) return absl::NotFoundError(absl::StrCat(paths[s], " lacks ", kv.key()));
      kv.value().copy_(it->second);
    }
    stage->eval();
    x = stage->forward(x);
  }
  return x;
}

// Copies the job's stage files into `dir` (what a user gathers from several machines).
void CopyStages(const v1::JobStatus& job, const std::string& dir) {
  fs::create_directories(dir);
  for (int s = 0; s < job.stages_size(); ++s) {
    fs::copy_file(job.stages(s).checkpoint_path(), absl::StrCat(dir, "/stage-", s, ".safetensors"),
                  fs::copy_options::overwrite_existing);
  }
}

// Rewrites a stage file through `edit` (the stage runtime's own reader and writer).
void Edit(const std::string& path, const std::function<void(sr::TensorFile&)>& edit) {
  absl::StatusOr<sr::TensorFile> f = sr::ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status();
  edit(*f);
  ASSERT_TRUE(sr::WriteSafetensors(path, *f).ok());
}

// Runs transformers on the exported directory `out` and our model on the checkpoints `paths` it was
// made from, on the same tokens; expects the same logits.
void ExpectTransformersMatchesUs(const std::string& python, const v1::JobStatus& job,
                                 const std::vector<std::string>& paths, const std::string& out, const std::string& what) {
  SCOPED_TRACE(what);
  // Two sequences over the whole context, so every position embedding is used.
  torch::manual_seed(11);
  const torch::Tensor tokens = torch::randint(0, kVocab, {2, kContext}, torch::kLong);
  absl::StatusOr<torch::Tensor> ours = OurLogits(job, paths, tokens);
  ASSERT_TRUE(ours.ok()) << ours.status();
  ASSERT_EQ(ours->sizes(), (std::vector<int64_t>{2, kContext, kVocab}));
  const std::string ours_path = out + "-ours.safetensors";
  ASSERT_TRUE(sr::WriteSafetensors(ours_path, {{{"tokens", tokens.to(torch::kFloat32)}, {"logits", *ours}}, {}}).ok());

  auto [rc, text] =
      Cluster::Run(absl::StrCat(python, " ", LONGHAUL_SOURCE_DIR "/tests/integration/hf_logits.py ", out, " ", ours_path));
  ASSERT_EQ(rc, 0) << text;
  // The JSON line is the last one (transformers may log above it).
  const size_t at = text.rfind("\n{");
  const nlohmann::json r = nlohmann::json::parse(text.substr(at == std::string::npos ? 0 : at + 1));
  EXPECT_TRUE(r["missing_keys"].empty()) << text;
  EXPECT_TRUE(r["unexpected_keys"].empty()) << text;
  EXPECT_TRUE(r["mismatched_keys"].empty()) << text;
  EXPECT_EQ(r["tied"], false) << text;
  ASSERT_TRUE(r.contains("rel_diff")) << text;
  const double rel = r["rel_diff"];
  std::printf("%s: transformers %s (torch %s) vs longhaul: max |diff| %.3g, relative difference %.3g (max |logit| %.3g)\n",
              what.c_str(), r["transformers"].get<std::string>().c_str(), r["torch"].get<std::string>().c_str(),
              r["max_abs_diff"].get<double>(), rel, r["max_abs_logit"].get<double>());
  ::testing::Test::RecordProperty(what + "_rel_diff", std::to_string(rel));
  EXPECT_LT(rel, 1e-4) << text;  // the issue's bar
  // Float32 noise between the two implementations is about 3e-7 here; the exact GELU instead of
  // the tanh form ("gelu" for "gelu_new") would give 1e-5. So the bar that catches that is lower.
  EXPECT_LT(rel, 3e-6) << text;
}

TEST_F(HfExportTest, TransformersLoadsTheExportAndItsLogitsMatchOurs) {
  const std::string python = Python();
  if (::access(python.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "SKIPPED: no Python environment at " << python
                 << " (tools/setup.sh installs torch and transformers there; LONGHAUL_NO_VENV=1 leaves it out)";
  }
  const std::string out = Dir("hf-model");
  auto [rc, text] = Export(out);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("exported job"), std::string::npos) << text;
  EXPECT_NE(text.find("at step 4"), std::string::npos) << text;
  std::ifstream cf(out + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_layer"], kLayers);
  EXPECT_EQ(config["n_head"], kHeads);
  EXPECT_EQ(config["vocab_size"], kVocab);
  EXPECT_EQ(config["n_positions"], kContext);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["longhaul"]["job_id"], job_->job_id());
  std::vector<std::string> paths;
  for (const auto& p : job_->stages()) paths.push_back(p.checkpoint_path());
  ExpectTransformersMatchesUs(python, *job_, paths, out, "trained");

  // A few steps leave the weights near their initialisation, where a wrong LayerNorm eps (1e-6)
  // changes the logits by only 1e-4. The same checkpoints with a residual stream 20x smaller, where
  // it changes them by 8e-3: the comparison must hold there too.
  const std::string dir = Dir("stressed");
  CopyStages(*job_, dir);
  paths = {dir + "/stage-0.safetensors", dir + "/stage-1.safetensors"};
  for (const std::string& path : paths) {
    Edit(path, [](sr::TensorFile& f) {
      for (auto& [name, t] : f.tensors) {
        if (name == "wte.weight" || name == "wpe.weight") t.mul_(0.05);
      }
    });
  }
  auto [rc2, text2] = Export(Dir("hf-stressed"), " --checkpoint-dir " + dir);
  ASSERT_EQ(rc2, 0) << text2;
  ExpectTransformersMatchesUs(python, *job_, paths, Dir("hf-stressed"), "stressed");
}

TEST_F(HfExportTest, GatheredCheckpointDirectoryExportsTheSameModel) {
  const std::string dir = Dir("gathered");
  CopyStages(*job_, dir);
  auto [rc1, t1] = Export(Dir("from-record"));
  ASSERT_EQ(rc1, 0) << t1;
  auto [rc2, t2] = Export(Dir("from-dir"), " --checkpoint-dir " + dir);
  ASSERT_EQ(rc2, 0) << t2;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const std::string a = slurp(Dir("from-record/model.safetensors"));
  EXPECT_GT(a.size(), 4u * (kVocab * kHidden * 2 + kContext * kHidden));
  EXPECT_EQ(a, slurp(Dir("from-dir/model.safetensors")));
}

TEST_F(HfExportTest, BrokenOrMissingCheckpointsAreRejectedNamingTheProblem) {
  const std::string dir = Dir("broken");
  const std::string s0 = dir + "/stage-0.safetensors", s1 = dir + "/stage-1.safetensors";
  auto expect_error = [&](const std::string& want) {
    auto [rc, text] = Export(Dir("never"), " --checkpoint-dir " + dir);
    EXPECT_EQ(rc, 1) << text;
    EXPECT_NE(text.find(want), std::string::npos) << "want \"" << want << "\" in:\n" << text;
    EXPECT_FALSE(fs::exists(Dir("never/model.safetensors")));
  };
  // A stage's file is missing.
  CopyStages(*job_, dir);
  fs::remove(s1);
  expect_error("stage 1 checkpoint " + s1 + ": No such file");
  // A tensor of another shape than the job's model.
  CopyStages(*job_, dir);
  Edit(s0, [](sr::TensorFile& f) { f.tensors["wpe.weight"] = torch::zeros({kContext + 1, kHidden}); });
  expect_error("tensor wpe.weight has shape [33, 64], the job's model");
  // A missing tensor.
  CopyStages(*job_, dir);
  Edit(s1, [](sr::TensorFile& f) { f.tensors.erase("h.2.mlp.c_fc.bias"); });
  expect_error("lacks tensor h.2.mlp.c_fc.bias");
  // A tensor GPT-2 has no place for (a model change the exporter does not know).
  CopyStages(*job_, dir);
  Edit(s1, [](sr::TensorFile& f) { f.tensors["h.2.attn.rotary.inv_freq"] = torch::ones({8}); });
  expect_error("holds tensor h.2.attn.rotary.inv_freq [8], which has no place in a GPT-2 stage");
  // Stages from different steps (a running job between two stages' checkpoints).
  CopyStages(*job_, dir);
  Edit(s1, [](sr::TensorFile& f) { f.metadata["step"] = "2"; });
  expect_error("different steps (stage 0: step 4, stage 1: step 2)");
  // Not a stage checkpoint.
  CopyStages(*job_, dir);
  Edit(s0, [](sr::TensorFile& f) { f.metadata.erase("format"); });
  expect_error("not a longhaul stage checkpoint");
  // A diverged run.
  CopyStages(*job_, dir);
  Edit(s1, [](sr::TensorFile& f) { f.tensors["ln_f.bias"][3] = NAN; });
  expect_error("ln_f.bias holds NaN or Inf");
  // Truncated.
  CopyStages(*job_, dir);
  fs::resize_file(s1, fs::file_size(s1) - 100);
  expect_error("truncated");

  auto [rc, text] = Cluster::Run(absl::StrCat(Ctl(*cluster_), " export 999 --out ", Dir("never")));
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("no job 999"), std::string::npos) << text;
  auto [rc2, text2] = Export(Dir("never"), " --format=onnx");
  EXPECT_EQ(rc2, 2) << text2;
}

// A running job is exported from its last checkpoint: here every stage writes into one directory
// (checkpoint.dir) every 2 steps, which the export finds through the job record's spec.
TEST_F(HfExportTest, RunningJobIsExportedFromItsLastCheckpoint) {
  const std::string ckdir = Dir("running-ckpt");
  std::string spec = Spec();
  spec.replace(spec.find("steps: 4"), 8, "steps: 100000");
  spec += absl::StrCat("checkpoint: {interval: 2, dir: ", ckdir, "}\n");
  absl::StatusOr<uint64_t> job = cluster_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster_->WaitForStep(*job, 3, absl::Minutes(2)).ok());
  const std::string cmd = absl::StrCat(Ctl(*cluster_), " export ", *job, " --out ", Dir("running-model"));
  // The stages write their checkpoints at slightly different moments: an export that catches
  // them at different steps says so, and the next attempt succeeds.
  std::pair<int, std::string> r;
  for (int attempt = 0; attempt < 20; ++attempt) {
    r = Cluster::Run(cmd);
    if (r.first == 0 || r.second.find("different steps") == std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("is RUNNING; exported its last checkpoint"), std::string::npos) << r.second;
  std::ifstream cf(Dir("running-model/config.json"));
  const nlohmann::json config = nlohmann::json::parse(cf);
  const int64_t step = config["longhaul"]["step"];
  EXPECT_GE(step, 2);
  EXPECT_EQ(step % 2, 0);
  auto [rc, text] = Cluster::Run(absl::StrCat(Ctl(*cluster_), " cancel ", *job));
  EXPECT_EQ(rc, 0) << text;
  ASSERT_TRUE(cluster_->WaitForEnd(*job, absl::Minutes(1)).ok());
  ASSERT_TRUE(cluster_->WaitForIdleWorkers(2, absl::Seconds(30)).ok());
}

// The CLI converts without LibTorch (it runs where the coordinator does, often a small machine).
TEST(HfExportCli, LonghaulctlDoesNotLinkLibTorch) {
  auto [rc, text] = Cluster::Run(absl::StrCat("ldd ", Cluster::Bin("longhaulctl")));
  ASSERT_EQ(rc, 0) << text;
  EXPECT_EQ(text.find("torch"), std::string::npos) << text;
}

}  // namespace
}  // namespace longhaul::cluster
