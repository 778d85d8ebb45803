// longhaul-bench convergence: trains the same small GPT on the default corpus with the in-process
// pipeline (same seed, same data order) and reports final train/validation loss and tokens/s, so
// compressed links can be compared with an uncompressed run.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "tools/cli/args.h"
#include "bench/benchmarks.h"
#include "stage_runtime/pipeline.h"

namespace longhaul::bench {
namespace {

constexpr char kHelp[] =
    "usage: longhaul-bench convergence [--steps=N] [--codec=SPEC] [--bwd-codec=SPEC]\n"
    "                                  [--schedule=1f1b|gpipe] [--stages=N] [--layers=N]\n"
    "                                  [--hidden=N] [--heads=N] [--context=N]\n"
    "                                  [--micro-batches=N] [--micro-batch-size=N]\n"
    "                                  [--lr=X] [--seed=N] [--eval-every=N] [--json]\n"
    "\n"
    "Trains a GPT (default 4 layers, hidden 128, 4 heads, context 64, byte vocab) split into\n"
    "--stages stages, with --codec on forward links and --bwd-codec on backward links (default:\n"
    "fp32 when --codec=fp32, else int8), on the fortunes corpus (90% train / 10% validation).\n"
    "Reports final_train_loss (mean of the last 10 steps), final_val_loss (16 fixed validation\n"
    "batches, through the same forward codec), initial_train_loss and tokens_per_s.\n"
    "Defaults: --steps=300 --codec=fp32 --schedule=1f1b --stages=4 --micro-batches=4\n"
    "--micro-batch-size=8 --lr=3e-3 --seed=1 --eval-every=50.\n";

}  // namespace

int ConvergenceBenchMain(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, {"steps", "codec", "bwd-codec", "schedule", "stages", "layers",
                                       "hidden", "heads", "context", "micro-batches",
                                       "micro-batch-size", "lr", "seed", "eval-every", "json", "help"});
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "longhaul-bench convergence: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  if (!args.ok()) {
    fail(args.status());
    std::fputs(kHelp, stderr);
    return 2;
  }
  if (args->Bool("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  stage_runtime::PipelineOptions o;
  auto steps = args->Int("steps", 300), stages = args->Int("stages", 4), layers = args->Int("layers", 4);
  auto hidden = args->Int("hidden", 128), heads = args->Int("heads", 4), context = args->Int("context", 64);
  auto mbs = args->Int("micro-batches", 4), mbsize = args->Int("micro-batch-size", 8);
  auto seed = args->Int("seed", 1), eval_every = args->Int("eval-every", 50);
  auto lr = args->Double("lr", 3e-3);
  for (const absl::Status& s : {steps.status(), stages.status(), layers.status(), hidden.status(),
                                heads.status(), context.status(), mbs.status(), mbsize.status(),
                                seed.status(), eval_every.status(), lr.status()}) {
    if (!s.ok()) return fail(s);
  }
  if (*steps < 1) return fail(absl::InvalidArgumentError("--steps must be >= 1"));
  auto schedule = stage_runtime::ParseSchedule(args->Str("schedule", "1f1b"));
  if (!schedule.ok()) return fail(schedule.status());
  o.model = {static_cast<int>(*layers), static_cast<int>(*hidden), static_cast<int>(*heads),
             static_cast<int>(*context), 256};
  o.stages = static_cast<int>(*stages);
  o.micro_batches = static_cast<int>(*mbs);
  o.micro_batch_size = static_cast<int>(*mbsize);
  o.schedule = *schedule;
  o.forward_codec = args->Str("codec", "fp32");
  o.backward_codec = args->Str("bwd-codec", o.forward_codec == "fp32" ? "fp32" : "int8");
  o.optimizer.lr = *lr;
  o.optimizer.min_lr = *lr / 10;
  o.optimizer.warmup_steps = static_cast<int>(std::min<int64_t>(20, *steps / 10 + 1));
  o.optimizer.total_steps = static_cast<int>(*steps);
  o.seed = static_cast<uint64_t>(*seed);
  const bool json = args->Bool("json");

  auto data = stage_runtime::TextDataset::DefaultCorpus();
  if (!data.ok()) return fail(data.status());
  auto pipe = stage_runtime::InProcessPipeline::Create(o);
  if (!pipe.ok()) return fail(pipe.status());

  std::vector<stage_runtime::Batch> val;
  for (int i = 0; i < 16; ++i) {
    val.push_back(data->Sample(stage_runtime::Split::kValidation, o.seed, 0, i, o.micro_batch_size, o.model.context));
  }
  const int64_t tokens_per_step = static_cast<int64_t>(o.micro_batches) * o.micro_batch_size * o.model.context;
  double first_loss = 0, tail_sum = 0, val_loss = 0;
  int tail_n = 0;
  double train_seconds = 0;
  for (int64_t step = 0; step < *steps; ++step) {
    std::vector<stage_runtime::Batch> b;
    for (int m = 0; m < o.micro_batches; ++m) {
      b.push_back(data->Sample(stage_runtime::Split::kTrain, o.seed, step, m, o.micro_batch_size, o.model.context));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*pipe)->TrainStep(b);
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok()) return fail(r.status());
    if (step == 0) first_loss = r->loss;
    if (step >= *steps - 10) tail_sum += r->loss, ++tail_n;
    const bool last = step + 1 == *steps;
    if (last || (*eval_every > 0 && (step + 1) % *eval_every == 0)) {
      auto v = (*pipe)->EvalLoss(val);
      if (!v.ok()) return fail(v.status());
      val_loss = *v;
      if (!json) {
        std::fprintf(stderr, "step %5lld/%lld  train loss %.4f  val loss %.4f  %.0f tokens/s\n",
                     (long long)step + 1, (long long)*steps, r->loss, val_loss,
                     tokens_per_step * (step + 1) / train_seconds);
      }
    }
  }
  int64_t raw = 0, wire = 0;
  double err = 0;
  for (const auto& l : (*pipe)->forward_links()) raw += l.raw_bytes, wire += l.wire_bytes, err += l.mean_rel_error();
  const size_t nl = (*pipe)->forward_links().size();
  const std::string out = absl::StrFormat(
      "{\"codec\": \"%s\", \"bwd_codec\": \"%s\", \"steps\": %d, \"stages\": %d, "
      "\"initial_train_loss\": %.5f, \"final_train_loss\": %.5f, \"final_val_loss\": %.5f, "
      "\"tokens_per_s\": %.1f, \"fwd_raw_bytes\": %d, \"fwd_wire_bytes\": %d, "
      "\"fwd_mean_rel_error\": %.5f}",
      o.forward_codec, o.backward_codec, *steps, o.stages, first_loss, tail_sum / tail_n, val_loss,
      tokens_per_step * (*steps) / train_seconds, raw, wire, nl ? err / nl : 0.0);
  if (json) {
    std::printf("%s\n", out.c_str());
  } else {
    std::printf("codec %s / %s: final train loss %.4f, final val loss %.4f, %.0f tokens/s, "
                "forward links %.2fx smaller than fp32\n",
                o.forward_codec.c_str(), o.backward_codec.c_str(), tail_sum / tail_n, val_loss,
                tokens_per_step * (*steps) / train_seconds, wire ? static_cast<double>(raw) / wire : 0.0);
  }
  return 0;
}

}  // namespace longhaul::bench
