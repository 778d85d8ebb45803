// longhaul-bench codec: compression and speed of one or more codecs on synthetic LLM-like
// activations (bench/synthetic_data.h), against memcpy bandwidth measured in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "bench/synthetic_data.h"
#include "codec/codec.h"
#include "common/flags.h"

namespace longhaul::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn until at least min_seconds have passed (and at least 3 times); returns the median time.
template <typename Fn>
double MedianSeconds(double min_seconds, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 3 || std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
    if (t.size() >= 50) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Flags {
  std::vector<std::string> codecs = {"tahquant"};
  int64_t tokens = 8192, hidden = 2048;
  int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  int64_t outliers = 4, seed = 1;
  double min_seconds = 0.5;
  std::string data = "activations";
  bool json = false;
};

struct Result {
  std::string spec;
  double bits = 0, rel_l2 = 0, enc = 0, dec = 0, dec_alloc = 0, enc_mt = 0, dec_mt = 0;
  double transformed_fraction = 0;
  int threads_needed = 0;
  std::string kernels;
};

int Run(const Flags& f, const CLI::App& cmd) {
  if (f.tokens <= 0 || f.hidden <= 0 || f.tokens * f.hidden > (int64_t{1} << 28) || f.threads < 1) {
    return common::FlagError(cmd, "need tokens, hidden, threads >= 1 and tokens * hidden <= 2^28");
  }
  if (f.data != "activations" && f.data != "gradients") {
    return common::FlagError(cmd, "--data is activations or gradients, not \"" + f.data + "\"");
  }
  const std::string& kind = f.data;
  ActivationSpec as;
  as.tokens = f.tokens;
  as.hidden = f.hidden;
  as.seed = static_cast<uint64_t>(f.seed);
  as.outlier_channels = static_cast<int>(f.outliers);
  if (!f.json) {
    std::fprintf(stderr, "generating %lld x %lld %s...\n", (long long)f.tokens, (long long)f.hidden, kind.c_str());
  }
  std::vector<float> data = kind == "gradients"
                                ? SyntheticGradients(f.tokens, f.hidden, as.seed, as.outlier_channels)
                                : SyntheticActivations(as);
  const torch::Tensor x = torch::from_blob(data.data(), {f.tokens, f.hidden}, torch::kFloat32);
  const double bytes = static_cast<double>(data.size()) * 4.0;

  std::vector<float> dst(data.size());
  const double memcpy_s = MedianSeconds(f.min_seconds, [&] { std::memcpy(dst.data(), data.data(), bytes); });
  const double memcpy_gbps = bytes / memcpy_s / 1e9;

  std::vector<Result> results;
  for (const std::string& spec : f.codecs) {
    auto codec = codec::MakeCodec(spec);
    if (!codec.ok()) return common::FlagError(cmd, std::string(codec.status().message()));
    if (!f.json) std::fprintf(stderr, "measuring %s...\n", (*codec)->spec().c_str());
    codec::EncodeStats st;
    auto frame = (*codec)->Encode(x, {}, &st);
    if (!frame.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: encode failed: %s\n", std::string(frame.status().message()).c_str());
      return 1;
    }
    auto y = codec::DecodeFrame(*frame);
    if (!y.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: decode failed: %s\n", std::string(y.status().message()).c_str());
      return 1;
    }
    Result r;
    r.spec = (*codec)->spec();
    // The kernel table serves the int<k>, tahquant and symmetric-quant engines; raw copies and
    // BitDP (scalar so far) do not use it.
    const codec::CodecId cid = (*codec)->id();
    const bool uses_kernels = cid == codec::CodecId::kIntK || cid == codec::CodecId::kTahQuant ||
                              cid == codec::CodecId::kSymQuant;
    r.kernels = uses_kernels ? codec::BestKernels().name : "scalar";
    r.bits = frame->size() * 8.0 / static_cast<double>(data.size());
    r.rel_l2 = ((x.to(torch::kFloat64) - y->to(torch::kFloat64)).norm() / x.to(torch::kFloat64).norm()).item<double>();
    r.transformed_fraction = st.groups ? static_cast<double>(st.transformed_groups) / st.groups : 0.0;
    const int mt = static_cast<int>(f.threads);
    r.enc = bytes / MedianSeconds(f.min_seconds, [&] { (void)(*codec)->Encode(x, {1}); }) / 1e9;
    // Decode into a reused tensor, as a pipeline link reuses its receive buffer; the cost of a
    // fresh 64 MB allocation (page faults) is reported separately.
    torch::Tensor out;
    r.dec = bytes / MedianSeconds(f.min_seconds, [&] { (void)codec::DecodeFrameInto(*frame, &out, {1}); }) / 1e9;
    r.dec_alloc = bytes / MedianSeconds(f.min_seconds, [&] { (void)codec::DecodeFrame(*frame, {1}); }) / 1e9;
    r.enc_mt = bytes / MedianSeconds(f.min_seconds, [&] { (void)(*codec)->Encode(x, {mt}); }) / 1e9;
    r.dec_mt = bytes / MedianSeconds(f.min_seconds, [&] { (void)codec::DecodeFrameInto(*frame, &out, {mt}); }) / 1e9;
    // A 10 Gbit/s link moves 1.25 GB/s of frames, i.e. 1.25 * 32 / bits GB/s of fp32 tensors.
    const double need = 1.25 * 32.0 / r.bits;
    r.threads_needed = static_cast<int>(std::ceil(need / std::min(r.enc, r.dec)));
    results.push_back(r);
  }

  if (f.json) {
    auto one_json = [&](const Result& r) {
      return nlohmann::ordered_json{
          {"codec", r.spec},
          {"tokens", f.tokens},
          {"hidden", f.hidden},
          {"bits_per_element", Round(r.bits, 4)},
          {"rel_l2_error", Round(r.rel_l2, 6)},
          {"encode_gbps", Round(r.enc, 3)},
          {"decode_gbps", Round(r.dec, 3)},
          {"decode_alloc_gbps", Round(r.dec_alloc, 3)},
          {"threads", f.threads},
          {"encode_gbps_mt", Round(r.enc_mt, 3)},
          {"decode_gbps_mt", Round(r.dec_mt, 3)},
          {"memcpy_gbps", Round(memcpy_gbps, 3)},
          {"encode_vs_memcpy", Round(r.enc / memcpy_gbps, 3)},
          {"decode_vs_memcpy", Round(r.dec / memcpy_gbps, 3)},
          {"transformed_group_fraction", Round(r.transformed_fraction, 4)},
          {"threads_for_10gbit", r.threads_needed},
          {"kernels", r.kernels},
          {"data", kind},
      };
    };
    // One codec: its object on one line; several: {"results": [...]}.
    if (results.size() == 1) {
      std::printf("%s\n", one_json(results[0]).dump().c_str());
      return 0;
    }
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const Result& r : results) all.push_back(one_json(r));
    std::printf("%s\n", nlohmann::ordered_json{{"results", all}}.dump(2).c_str());
    return 0;
  }
  std::printf("%lld x %lld fp32 %s (%.0f MB), %lld outlier channels, SIMD kernels: %s\n",
              (long long)f.tokens, (long long)f.hidden, kind.c_str(), bytes / 1e6, (long long)f.outliers,
              codec::BestKernels().name);
  std::printf("memcpy (1 thread): %.2f GB/s\n\n", memcpy_gbps);
  std::printf("| codec | bits/elem | rel L2 err | enc GB/s | dec GB/s | dec GB/s (new tensor) | enc/memcpy | dec/memcpy | enc GB/s x%lld | dec GB/s x%lld | threads for 10 Gbit/s |\n",
              (long long)f.threads, (long long)f.threads);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %.3f | %.4f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |\n", r.spec.c_str(),
                r.bits, r.rel_l2, r.enc, r.dec, r.dec_alloc, r.enc / memcpy_gbps, r.dec / memcpy_gbps, r.enc_mt,
                r.dec_mt, r.threads_needed);
  }
  return 0;
}

}  // namespace

BenchmarkRun AddCodecBench(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* cmd =
      app.add_subcommand("codec", "bits/element, relative L2 error, encode/decode GB/s vs memcpy");
  cmd->add_option("--codec", f->codecs, "codec spec, may be repeated (codec/codec.h)")->type_name("SPEC");
  cmd->add_option("--tokens", f->tokens, "rows of the tensor")->type_name("N");
  cmd->add_option("--hidden", f->hidden, "columns of the tensor (tokens * hidden <= 2^28)")->type_name("N");
  cmd->add_option("--threads", f->threads, "threads of the _mt figures (default: all cores)")->type_name("N");
  cmd->add_option("--outliers", f->outliers, "heavy channels (activations) or columns (gradients)")->type_name("N");
  cmd->add_option("--seed", f->seed, "synthetic data seed")->type_name("N");
  cmd->add_option("--min-seconds", f->min_seconds, "time each figure is repeated for (median reported)")
      ->type_name("S");
  cmd->add_option("--data", f->data, "activations or gradients")->type_name("KIND");
  cmd->add_flag("--json", f->json, "one JSON object per codec instead of a table");
  cmd->footer(
      "Encodes and decodes a synthetic [tokens, hidden] fp32 tensor (default activations: Gaussian\n"
      "body, --outliers heavy channels, log-normal token energy, 5% spiky tokens; --data=gradients:\n"
      "heavy-tailed synthetic gradients, Student-t, per-row scales, outlier columns, rows are output\n"
      "channels for BitDP; bench/synthetic_data.h) and reports (JSON keys):\n"
      "  bits_per_element   frame bytes * 8 / elements, header and all metadata included\n"
      "  rel_l2_error       ||x - decode(encode(x))|| / ||x||\n"
      "  encode_gbps        GB/s of fp32 input, one thread (median of repetitions)\n"
      "  decode_gbps        GB/s of fp32 output, one thread, into a reused output tensor\n"
      "  decode_alloc_gbps  the same into a freshly allocated tensor (page faults included)\n"
      "  encode_gbps_mt     the same with --threads threads (and decode_gbps_mt)\n"
      "  memcpy_gbps        one-thread memcpy of the same fp32 buffer, measured in this run\n"
      "  threads_for_10gbit threads needed so neither side limits a 10 Gbit/s link\n"
      "With several --codec, the objects are in {\"results\": [...]}.");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
