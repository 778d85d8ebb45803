// longhaul-bench convergence: trains the same GPT with the in-process pipeline (the workers' step
// loop; same seed, same data order) and reports final train/validation loss and tokens/s, so
// compressed links can be compared with an uncompressed run. Small byte-level models on the CPU by
// default; GPT-2 presets, token files, bf16 and GPUs by flags.
//
// --replicas=N or N0,N1,... (docs/replicated-stages.md): every stage N replicas, or stage s N_s,
// in this process (bench/replicated_pipeline.h), every stage's replicas synchronised after the
// backward pass by the workers' own worker::ReplicaSync with --dp-codec, over
// collective::InProcessHub transports instead of gRPC (the same collective algorithms, codecs and
// optimizer code; only the bytes' carrier differs). Replica r of stage s takes micro-batches
// r*M/N_s .. (r+1)*M/N_s-1 of the step, as a job's replicas do, so the global batch does not
// change with the counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "bench/benchmarks.h"
#include "bench/replicated_pipeline.h"
#include "common/flags.h"
#include "stage_runtime/model_presets.h"
#include "stage_runtime/pipeline.h"

namespace longhaul::bench {
namespace {

struct Flags {
  int64_t steps = 300, stages = 4, layers = 4, hidden = 128, heads = 4, context = 64;
  int64_t micro_batches = 4, micro_batch_size = 8, seed = 1, eval_every = 50;
  double lr = 3e-3;
  int64_t vocab = 256, val_batches = 16, codec_threads = 1;
  std::vector<int> replicas = {1};  // one count for every stage, or one per stage
  int64_t dp_regions = 0, dp_weight_bits = 4;
  std::string codec = "fp32", bwd_codec, schedule = "1f1b", dp_codec = "fp32";
  std::string preset, data_format = "text", corpus = stage_runtime::kDefaultCorpusDir;
  std::string device = "cpu", precision = "fp32";
  bool json = false;
};

int Run(const Flags& f, const CLI::App& cmd) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "longhaul-bench convergence: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  if (f.steps < 1) return common::FlagError(cmd, "--steps must be >= 1");
  auto schedule = stage_runtime::ParseSchedule(f.schedule);
  if (!schedule.ok()) return common::FlagError(cmd, std::string(schedule.status().message()));
  stage_runtime::PipelineOptions o;
  o.model = {static_cast<int>(f.layers), static_cast<int>(f.hidden), static_cast<int>(f.heads),
             static_cast<int>(f.context), static_cast<int>(f.vocab)};
  if (!f.preset.empty()) {
    // The preset's shape; --context (and --vocab for token data) still apply when given.
    const stage_runtime::ModelPreset* p = stage_runtime::FindModelPreset(f.preset);
    if (p == nullptr) return common::FlagError(cmd, "--preset must be one of " + stage_runtime::ModelPresetNames());
    o.model = {p->layers, p->hidden, p->heads, cmd.count("--context") ? static_cast<int>(f.context) : p->context,
               cmd.count("--vocab") ? static_cast<int>(f.vocab) : p->vocab};
  }
  auto device = stage_runtime::ParseDevice(f.device);
  if (!device.ok()) return common::FlagError(cmd, "--device: " + std::string(device.status().message()));
  auto precision = stage_runtime::ParsePrecision(f.precision);
  if (!precision.ok()) return common::FlagError(cmd, "--precision: " + std::string(precision.status().message()));
  o.device = *device;
  o.precision = *precision;
  o.codec_threads = static_cast<int>(f.codec_threads);
  o.stages = static_cast<int>(f.stages);
  o.micro_batches = static_cast<int>(f.micro_batches);
  o.micro_batch_size = static_cast<int>(f.micro_batch_size);
  o.schedule = *schedule;
  o.forward_codec = f.codec;
  o.backward_codec = !f.bwd_codec.empty() ? f.bwd_codec : o.forward_codec == "fp32" ? "fp32" : "int8";
  o.optimizer.lr = f.lr;
  o.optimizer.min_lr = f.lr / 10;
  o.optimizer.warmup_steps = static_cast<int>(std::min<int64_t>(20, f.steps / 10 + 1));
  o.optimizer.total_steps = static_cast<int>(f.steps);
  o.seed = static_cast<uint64_t>(f.seed);
  const bool json = f.json;
  const int64_t steps = f.steps;

  auto opened = stage_runtime::OpenDataset({f.data_format, f.corpus, o.model.vocab, 0.1}, o.model.context);
  if (!opened.ok()) return fail(opened.status());
  const stage_runtime::Dataset* data = opened->get();
  // One pipeline, or --replicas of them joined by ReplicaSync: the loop below drives either.
  std::unique_ptr<stage_runtime::InProcessPipeline> single;
  std::unique_ptr<ReplicatedPipeline> replicated;
  auto dp_codec = collective::ParseDpCodec(f.dp_codec);
  if (!dp_codec.ok()) return common::FlagError(cmd, "--dp-codec: " + std::string(dp_codec.status().message()));
  absl::StatusOr<std::vector<int>> per_stage = CountsPerStage(f.replicas, o.stages, o.micro_batches);
  if (!per_stage.ok()) return common::FlagError(cmd, absl::StrCat("--replicas: ", per_stage.status().message()));
  const std::vector<int>& counts = *per_stage;
  const int most = *std::max_element(counts.begin(), counts.end());
  const int regions = static_cast<int>(f.dp_regions > 0 ? f.dp_regions : most);
  if (most > 1) {
    auto p = ReplicatedPipeline::Create(o, counts, *dp_codec, regions, static_cast<int>(f.dp_weight_bits));
    if (!p.ok()) return fail(p.status());
    replicated = std::move(*p);
  } else {
    auto p = stage_runtime::InProcessPipeline::Create(o);
    if (!p.ok()) return fail(p.status());
    single = std::move(*p);
  }
  auto train_step = [&](const std::vector<stage_runtime::Batch>& b) {
    return replicated ? replicated->TrainStep(b) : single->TrainStep(b);
  };
  auto eval_loss = [&](const std::vector<stage_runtime::Batch>& b) {
    return replicated ? replicated->EvalLoss(b) : single->EvalLoss(b);
  };
  int64_t dp_bytes = 0, dp_wire = 0, dp_raw = 0;  // every replica and stage, summed over the steps
  double dp_seconds = 0;                          // the slowest replica's sync, summed over the steps

  std::vector<stage_runtime::Batch> val;
  for (int i = 0; i < f.val_batches; ++i) {
    val.push_back(data->Sample(stage_runtime::Split::kValidation, o.seed, 0, i, o.micro_batch_size, o.model.context));
  }
  const int64_t tokens_per_step = static_cast<int64_t>(o.micro_batches) * o.micro_batch_size * o.model.context;
  double first_loss = 0, tail_sum = 0, val_loss = 0;
  int tail_n = 0;
  double train_seconds = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<stage_runtime::Batch> b;
    for (int m = 0; m < o.micro_batches; ++m) {
      b.push_back(data->Sample(stage_runtime::Split::kTrain, o.seed, step, m, o.micro_batch_size, o.model.context));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = train_step(b);
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok()) return fail(r.status());
    if (replicated) {
      const collective::CallStats& d = replicated->last_dp();
      dp_bytes += d.bytes_sent, dp_wire += d.wire_bytes_sent, dp_raw += d.bytes_sent_uncompressed;
      dp_seconds += absl::ToDoubleSeconds(replicated->last_dp_wall());
    }
    if (step == 0) first_loss = r->loss;
    if (step >= steps - 10) tail_sum += r->loss, ++tail_n;
    const bool last = step + 1 == steps;
    if (last || (f.eval_every > 0 && (step + 1) % f.eval_every == 0)) {
      auto v = eval_loss(val);
      if (!v.ok()) return fail(v.status());
      val_loss = *v;
      if (!json) {
        std::fprintf(stderr, "step %5lld/%lld  train loss %.4f  val loss %.4f  %.0f tokens/s\n",
                     (long long)step + 1, (long long)steps, r->loss, val_loss,
                     tokens_per_step * (step + 1) / train_seconds);
      }
    }
  }
  // The forward links' bytes, and their codec error over every frame measured (a replica that
  // streams to several measures on one of them: a mean over links would count the others as 0).
  int64_t raw = 0, wire = 0, measured = 0;
  double err = 0;
  const std::vector<stage_runtime::LinkStats> links = replicated ? replicated->forward_links() : single->forward_links();
  for (const auto& l : links) {
    raw += l.raw_bytes, wire += l.wire_bytes, err += l.sum_rel_error, measured += l.error_samples;
  }
  const nlohmann::ordered_json out = {
      {"codec", o.forward_codec},
      {"model", f.preset.empty() ? "custom" : f.preset},
      {"layers", o.model.layers},
      {"hidden", o.model.hidden},
      {"context", o.model.context},
      {"vocab", o.model.vocab},
      {"data", f.data_format + ":" + f.corpus},
      {"device", f.device},
      {"precision", f.precision},
      {"tokens_per_step", tokens_per_step},
      {"bwd_codec", o.backward_codec},
      {"steps", steps},
      {"stages", o.stages},
      {"initial_train_loss", Round(first_loss, 5)},
      {"final_train_loss", Round(tail_sum / tail_n, 5)},
      {"final_val_loss", Round(val_loss, 5)},
      {"tokens_per_s", Round(tokens_per_step * steps / train_seconds, 1)},
      {"fwd_raw_bytes", raw},
      {"fwd_wire_bytes", wire},
      {"fwd_mean_rel_error", Round(measured ? err / static_cast<double>(measured) : 0.0, 5)},
      {"replicas", f.replicas.size() == 1 ? nlohmann::ordered_json(f.replicas[0]) : nlohmann::ordered_json()},
      {"stage_replicas", counts},  // "replicas" is null for a per-stage list
      {"dp_codec", most > 1 ? f.dp_codec : "none"},
      {"dp_regions", most > 1 ? regions : 0},
      {"dp_bytes_per_step", Round(static_cast<double>(dp_bytes) / steps, 0)},
      {"dp_wire_bytes_per_step", Round(static_cast<double>(dp_wire) / steps, 0)},
      {"dp_raw_bytes_per_step", Round(static_cast<double>(dp_raw) / steps, 0)},
      {"dp_seconds_per_step", Round(dp_seconds / steps, 4)},
      {"train_seconds", Round(train_seconds, 2)},
  };
  if (json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("codec %s / %s: final train loss %.4f, final val loss %.4f, %.0f tokens/s, "
                "forward links %.2fx smaller than fp32\n",
                o.forward_codec.c_str(), o.backward_codec.c_str(), tail_sum / tail_n, val_loss,
                tokens_per_step * (steps) / train_seconds, wire ? static_cast<double>(raw) / wire : 0.0);
    if (replicated) {
      std::printf("replicas per stage [%s] in %d region(s), data-parallel %s: %.0f bytes per step (all replicas; "
                  "%.2fx smaller than fp32), %.3f s per step synchronising\n",
                  absl::StrJoin(counts, ", ").c_str(), regions, f.dp_codec.c_str(), static_cast<double>(dp_bytes) / steps,
                  dp_bytes ? static_cast<double>(dp_raw) / dp_bytes : 0.0, dp_seconds / steps);
    }
  }
  return 0;
}

}  // namespace

BenchmarkRun AddConvergenceBench(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "convergence", "train a small GPT through the in-process pipeline with a link codec");
  cmd->add_option("--steps", f->steps, "training steps")->type_name("N");
  cmd->add_option("--codec", f->codec, "forward-link codec")->type_name("SPEC");
  cmd->add_option("--bwd-codec", f->bwd_codec, "backward-link codec (empty: fp32 when --codec=fp32, else int8)")
      ->type_name("SPEC");
  cmd->add_option("--schedule", f->schedule, "1f1b or gpipe")->type_name("NAME");
  cmd->add_option("--stages", f->stages, "pipeline stages")->type_name("N");
  cmd->add_option("--layers", f->layers, "transformer layers")->type_name("N");
  cmd->add_option("--hidden", f->hidden, "hidden size")->type_name("N");
  cmd->add_option("--heads", f->heads, "attention heads")->type_name("N");
  cmd->add_option("--context", f->context, "context length (tokens)")->type_name("N");
  cmd->add_option("--micro-batches", f->micro_batches, "micro-batches per step")->type_name("N");
  cmd->add_option("--micro-batch-size", f->micro_batch_size, "sequences per micro-batch")->type_name("N");
  cmd->add_option("--lr", f->lr, "peak learning rate")->type_name("X");
  cmd->add_option("--seed", f->seed, "model and data seed")->type_name("N");
  cmd->add_option("--eval-every", f->eval_every, "validation loss every N steps (0: at the end only)")
      ->type_name("N");
  cmd->add_option("--vocab", f->vocab, "vocabulary (256 for bytes; the tokenizer's for token files)")->type_name("N");
  cmd->add_option("--preset", f->preset, "a GPT-2 shape instead of --layers/--hidden/--heads: " +
                                             stage_runtime::ModelPresetNames() + " (--context, --vocab still apply)")
      ->type_name("NAME");
  cmd->add_option("--data-format", f->data_format, "text (bytes of --corpus) or tokens-u16 (train.bin/val.bin in --corpus)")
      ->type_name("FORMAT");
  cmd->add_option("--corpus", f->corpus, "text file or directory, or the token files' directory")->type_name("PATH");
  cmd->add_option("--device", f->device, "cpu, cuda or cuda:N (every stage on it)")->type_name("DEV");
  cmd->add_option("--precision", f->precision, "fp32 or bf16 (bf16 matrix products, fp32 master weights)")
      ->type_name("NAME");
  cmd->add_option("--codec-threads", f->codec_threads, "threads per encode/decode")->type_name("N");
  cmd->add_option("--val-batches", f->val_batches, "fixed validation micro-batches for the validation loss")
      ->type_name("N");
  cmd->add_option("--replicas", f->replicas,
                  "replicas per stage (1: one pipeline; N: every stage N, synchronised by --dp-codec; "
                  "N0,N1,...: stage s N_s)")
      ->type_name("N|N0,N1,...")
      ->delimiter(',')
      ->default_str("1");
  cmd->add_option("--dp-codec", f->dp_codec, "data-parallel sync of the replicas: fp32, sdp4bit, bitdp1, bitdp2, zeropp")
      ->type_name("NAME");
  cmd->add_option("--dp-regions", f->dp_regions,
                  "regions the replicas are dealt to in turn (0: one each; 1: all in one, sdp4bit's gradients "
                  "then cross no 4-bit level)")
      ->type_name("N");
  cmd->add_option("--dp-weight-bits", f->dp_weight_bits, "sdp4bit's qWD / zeropp's qwZ bits (4 or 8)")->type_name("N");
  cmd->add_flag("--json", f->json, "one JSON object instead of progress and a summary line");
  cmd->footer(
      "Trains a GPT split into --stages stages, with --codec on forward links and --bwd-codec on\n"
      "backward links, by default byte-level on the fortunes corpus (90% train / 10% validation).\n"
      "Reports final_train_loss (mean of the last 10 steps), final_val_loss (--val-batches fixed\n"
      "validation batches, through the same forward codec), initial_train_loss and tokens_per_s.\n"
      "--replicas=N runs N pipelines in this process, each on micro-batches r*M/N..(r+1)*M/N-1 of the\n"
      "step (the global batch stays M x --micro-batch-size); --replicas=2,1 gives stage 0 two replicas,\n"
      "both streaming to stage 1's one (every count must divide M). Each stage's replicas synchronise by\n"
      "the workers' ReplicaSync (worker/replica_sync.h) over in-process transports; the validation loss is\n"
      "replica 0's model (the replicas' are bit-identical). Adds dp_bytes_per_step (all replicas),\n"
      "dp_raw_bytes_per_step (the same messages as fp32) and dp_seconds_per_step (slowest replica).");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
