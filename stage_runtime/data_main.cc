// longhaul-data: prepares training data for jobs with `data.format: tokens-u16`.
//   longhaul-data prepare --input=TEXT_FILE_OR_DIR [--input=...] --out=DIR [--vocab-size=8000]
//                         [--tokenizer=EXISTING.model] [--val-fraction=0.05]
// A process without gRPC or LibTorch (data_prep.h says why).
#include <cstdio>
#include <string>
#include <vector>

#include "common/flags.h"
#include "stage_runtime/data_prep.h"

int main(int argc, char** argv) {
  CLI::App app{"Prepares training data: trains a SentencePiece BPE tokenizer on text (or uses an existing one) "
               "and writes train.bin / val.bin (uint16 tokens), tokenizer.model and meta.json for "
               "`data: {format: tokens-u16, corpus: DIR}` in a job spec.",
               "longhaul-data"};
  app.require_subcommand(1);
  longhaul::stage_runtime::PrepareOptions o;
  CLI::App* prepare = app.add_subcommand("prepare", "tokenize text files or directories into DIR");
  prepare->option_defaults()->always_capture_default();
  prepare->add_option("--input", o.inputs, "text file or directory (its files, *.dat skipped); repeatable")
      ->required()
      ->type_name("PATH");
  prepare->add_option("--out", o.out_dir, "output directory")->required()->type_name("DIR");
  prepare->add_option("--vocab-size", o.vocab_size, "tokenizer vocabulary when training one (256..65536)")
      ->check(CLI::Range(256, 65536));
  prepare->add_option("--tokenizer", o.tokenizer, "an existing SentencePiece model to use instead of training one")
      ->type_name("FILE");
  prepare->add_option("--val-fraction", o.val_fraction, "share of the text (its end) held out for validation")
      ->check(CLI::Range(0.0001, 0.5));
  if (std::optional<int> rc = longhaul::common::ParseFlags(app, argc, argv)) return *rc;
  o.progress = [](const std::string& line) { std::fprintf(stderr, "longhaul-data: %s\n", line.c_str()); };
  absl::StatusOr<longhaul::stage_runtime::PrepareResult> r = longhaul::stage_runtime::PrepareTokenData(o);
  if (!r.ok()) {
    std::fprintf(stderr, "longhaul-data prepare: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  std::printf("vocab_size %d, train_tokens %lld, val_tokens %lld -> %s (set model.vocab >= %d)\n", r->vocab_size,
              static_cast<long long>(r->train_tokens), static_cast<long long>(r->val_tokens), o.out_dir.c_str(),
              r->vocab_size);
  return 0;
}
