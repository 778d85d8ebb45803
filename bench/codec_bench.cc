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

#include "absl/strings/str_format.h"
#include "tools/cli/args.h"
#include "bench/benchmarks.h"
#include "bench/synthetic_data.h"
#include "codec/codec.h"

namespace longhaul::bench {
namespace {

constexpr char kHelp[] =
    "usage: longhaul-bench codec [--codec=SPEC ...] [--tokens=N] [--hidden=N] [--threads=N]\n"
    "                            [--outliers=N] [--seed=N] [--min-seconds=S] [--data=activations|gradients]\n"
    "                            [--json]\n"
    "\n"
    "Encodes and decodes a synthetic [tokens, hidden] fp32 tensor (default activations: Gaussian body,\n"
    "`outliers` heavy channels, log-normal token energy, 5% spiky tokens) and reports:\n"
    "  bits_per_element   frame bytes * 8 / elements, header and all metadata included\n"
    "  rel_l2_error       ||x - decode(encode(x))|| / ||x||\n"
    "  encode_gbps        GB/s of fp32 input, one thread (median of repetitions)\n"
    "  decode_gbps        GB/s of fp32 output, one thread, into a reused output tensor\n"
    "  decode_alloc_gbps  the same into a freshly allocated tensor (page faults included)\n"
    "  encode_gbps_mt     the same with --threads threads (default: all cores)\n"
    "  memcpy_gbps        one-thread memcpy of the same fp32 buffer, measured in this run\n"
    "  threads_for_10gbit threads needed so neither side limits a 10 Gbit/s link\n"
    "--codec may be repeated (default tahquant); see codec/codec.h for spec strings.\n"
    "--data=gradients uses heavy-tailed synthetic gradients (Student-t, per-row scales, outlier\n"
    "columns; bench/synthetic_data.h) instead of activations; rows are output channels for BitDP.\n"
    "Defaults: --tokens=8192 --hidden=2048 --outliers=4 --seed=1 --min-seconds=0.5.\n";

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

struct Result {
  std::string spec;
  double bits = 0, rel_l2 = 0, enc = 0, dec = 0, dec_alloc = 0, enc_mt = 0, dec_mt = 0;
  double transformed_fraction = 0;
  int threads_needed = 0;
  std::string kernels;
};

}  // namespace

int CodecBenchMain(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, {"codec", "tokens", "hidden", "threads", "outliers", "seed",
                                       "min-seconds", "data", "json", "help"});
  if (std::optional<int> rc = cli::ExitForParseErrorOrHelp(args, "longhaul-bench codec", kHelp)) return *rc;
  auto tokens = args->Int("tokens", 8192), hidden = args->Int("hidden", 2048);
  auto threads = args->Int("threads", std::max(1u, std::thread::hardware_concurrency()));
  auto outliers = args->Int("outliers", 4), seed = args->Int("seed", 1);
  auto min_s = args->Double("min-seconds", 0.5);
  for (const absl::Status& s : {tokens.status(), hidden.status(), threads.status(),
                                outliers.status(), seed.status(), min_s.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (*tokens <= 0 || *hidden <= 0 || *tokens * *hidden > (int64_t{1} << 28) || *threads < 1) {
    std::fprintf(stderr, "longhaul-bench codec: need tokens, hidden, threads >= 1 and tokens*hidden <= 2^28\n");
    return 2;
  }
  std::vector<std::string> specs = args->Values("codec");
  if (specs.empty()) specs.push_back("tahquant");
  const bool json = args->Bool("json");

  const std::string kind = args->Str("data", "activations");
  if (kind != "activations" && kind != "gradients") {
    std::fprintf(stderr, "longhaul-bench codec: --data is activations or gradients, not \"%s\"\n", kind.c_str());
    return 2;
  }
  ActivationSpec as;
  as.tokens = *tokens;
  as.hidden = *hidden;
  as.seed = static_cast<uint64_t>(*seed);
  as.outlier_channels = static_cast<int>(*outliers);
  if (!json) {
    std::fprintf(stderr, "generating %lld x %lld %s...\n", (long long)*tokens, (long long)*hidden, kind.c_str());
  }
  std::vector<float> data = kind == "gradients"
                                ? SyntheticGradients(*tokens, *hidden, as.seed, as.outlier_channels)
                                : SyntheticActivations(as);
  const torch::Tensor x = torch::from_blob(data.data(), {*tokens, *hidden}, torch::kFloat32);
  const double bytes = static_cast<double>(data.size()) * 4.0;

  std::vector<float> dst(data.size());
  const double memcpy_s = MedianSeconds(*min_s, [&] { std::memcpy(dst.data(), data.data(), bytes); });
  const double memcpy_gbps = bytes / memcpy_s / 1e9;

  std::vector<Result> results;
  for (const std::string& spec : specs) {
    auto codec = codec::MakeCodec(spec);
    if (!codec.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: %s\n", std::string(codec.status().message()).c_str());
      return 2;
    }
    if (!json) std::fprintf(stderr, "measuring %s...\n", (*codec)->spec().c_str());
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
    const int mt = static_cast<int>(*threads);
    r.enc = bytes / MedianSeconds(*min_s, [&] { (void)(*codec)->Encode(x, {1}); }) / 1e9;
    // Decode into a reused tensor, as a pipeline link reuses its receive buffer; the cost of a
    // fresh 64 MB allocation (page faults) is reported separately.
    torch::Tensor out;
    r.dec = bytes / MedianSeconds(*min_s, [&] { (void)codec::DecodeFrameInto(*frame, &out, {1}); }) / 1e9;
    r.dec_alloc = bytes / MedianSeconds(*min_s, [&] { (void)codec::DecodeFrame(*frame, {1}); }) / 1e9;
    r.enc_mt = bytes / MedianSeconds(*min_s, [&] { (void)(*codec)->Encode(x, {mt}); }) / 1e9;
    r.dec_mt = bytes / MedianSeconds(*min_s, [&] { (void)codec::DecodeFrameInto(*frame, &out, {mt}); }) / 1e9;
    // A 10 Gbit/s link moves 1.25 GB/s of frames, i.e. 1.25 * 32 / bits GB/s of fp32 tensors.
    const double need = 1.25 * 32.0 / r.bits;
    r.threads_needed = static_cast<int>(std::ceil(need / std::min(r.enc, r.dec)));
    results.push_back(r);
  }

  auto one_json = [&](const Result& r) {
    return absl::StrFormat(
        "{\"codec\": \"%s\", \"tokens\": %d, \"hidden\": %d, \"bits_per_element\": %.4f, "
        "\"rel_l2_error\": %.6f, \"encode_gbps\": %.3f, \"decode_gbps\": %.3f, "
        "\"decode_alloc_gbps\": %.3f, "
        "\"threads\": %d, \"encode_gbps_mt\": %.3f, \"decode_gbps_mt\": %.3f, "
        "\"memcpy_gbps\": %.3f, \"encode_vs_memcpy\": %.3f, \"decode_vs_memcpy\": %.3f, "
        "\"transformed_group_fraction\": %.4f, \"threads_for_10gbit\": %d, \"kernels\": \"%s\", "
        "\"data\": \"%s\"}",
        r.spec, *tokens, *hidden, r.bits, r.rel_l2, r.enc, r.dec, r.dec_alloc, *threads, r.enc_mt, r.dec_mt,
        memcpy_gbps, r.enc / memcpy_gbps, r.dec / memcpy_gbps, r.transformed_fraction,
        r.threads_needed, r.kernels, kind);
  };
  if (json) {
    if (results.size() == 1) {
      std::printf("%s\n", one_json(results[0]).c_str());
    } else {
      std::printf("{\"results\": [\n");
      for (size_t i = 0; i < results.size(); ++i) {
        std::printf("  %s%s\n", one_json(results[i]).c_str(), i + 1 < results.size() ? "," : "");
      }
      std::printf("]}\n");
    }
    return 0;
  }
  std::printf("%lld x %lld fp32 %s (%.0f MB), %lld outlier channels, SIMD kernels: %s\n",
              (long long)*tokens, (long long)*hidden, kind.c_str(), bytes / 1e6, (long long)*outliers,
              codec::BestKernels().name);
  std::printf("memcpy (1 thread): %.2f GB/s\n\n", memcpy_gbps);
  std::printf("| codec | bits/elem | rel L2 err | enc GB/s | dec GB/s | dec GB/s (new tensor) | enc/memcpy | dec/memcpy | enc GB/s x%lld | dec GB/s x%lld | threads for 10 Gbit/s |\n",
              (long long)*threads, (long long)*threads);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %.3f | %.4f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |\n", r.spec.c_str(),
                r.bits, r.rel_l2, r.enc, r.dec, r.dec_alloc, r.enc / memcpy_gbps, r.dec / memcpy_gbps, r.enc_mt,
                r.dec_mt, r.threads_needed);
  }
  return 0;
}

}  // namespace longhaul::bench
