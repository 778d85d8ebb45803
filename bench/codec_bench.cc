// longhaul-bench codec: compression and speed of one or more codecs on synthetic LLM-like
// activations (bench/synthetic_data.h), against memcpy bandwidth measured in the same run; with
// --device=cuda:N, the GPU codecs (codec/cuda/gpu_codec.h) against a device-to-device copy.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmarks.h"
#include "bench/synthetic_data.h"
#include "bench/torch_trace.h"
#include "codec/bitdp.h"
#include "codec/codec.h"
#include "codec/codec_gpu.h"
#include "codec/cuda/gpu_codec.h"
#include "codec/spec.h"
#include "common/flags.h"
#include "stage_runtime/executor.h"

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
  std::string device = "cpu";
  std::string dtype = "fp32";
  int64_t iters = 20;
  bool json = false;
  std::string trace;  // --trace: --iters more encodes and decodes under LibTorch's profiler
};

struct Result {
  std::string spec;
  double bits = 0, rel_l2 = 0, enc = 0, dec = 0, dec_alloc = 0, enc_mt = 0, dec_mt = 0;
  double transformed_fraction = 0;
  int threads_needed = 0;
  std::string kernels;
};

// --- --device=cuda:N: the GPU codecs ---

struct DeviceResult {
  std::string spec;
  double bits = 0, rel_l2 = 0, enc = 0, dec = 0, copy = 0, enc_host = 0, dec_host = 0;
  double transformed_fraction = 0;
  bool byte_identical = false, decode_identical = false;
  absl::Status traced;  // --trace's outcome (the figures stand either way)
};

// Seconds per call of fn, which queues work on the legacy default stream (LibTorch's default
// stream, where the GPU codecs run here): one warm-up call, then 3 rounds of `iters` calls, each
// round closed by a synchronisation; the median round's mean.
template <typename Fn>
absl::StatusOr<double> DeviceSeconds(int64_t iters, Fn&& fn) {
  if (absl::Status s = fn(); !s.ok()) return s;
  if (absl::Status s = codec::gpu::Synchronize(nullptr); !s.ok()) return s;
  std::vector<double> t;
  for (int round = 0; round < 3; ++round) {
    const auto a = Clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      if (absl::Status s = fn(); !s.ok()) return s;
    }
    if (absl::Status s = codec::gpu::Synchronize(nullptr); !s.ok()) return s;
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count() / static_cast<double>(iters));
  }
  std::sort(t.begin(), t.end());
  return t[1];
}

// One codec on the device: frames and decodes checked against the CPU's, then timed.
absl::StatusOr<DeviceResult> MeasureOnDevice(const std::string& spec_text, const torch::Tensor& x_host,
                                             const torch::Tensor& x_dev, double bytes, const Flags& f) {
  absl::StatusOr<codec::CodecSpec> spec = codec::ParseCodecSpec(spec_text);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::unique_ptr<codec::Codec>> c = codec::MakeCodec(spec_text);
  if (!c.ok()) return c.status();
  const codec::Codec& cd = **c;
  const torch::Device dev = x_dev.device();
  DeviceResult r;
  r.spec = cd.spec();

  // The frames: the CPU's (reference) and the GPU's, which must be the same bytes.
  codec::EncodeOptions cpu_opts;
  cpu_opts.threads = static_cast<int>(f.threads);
  cpu_opts.device = codec::CodecDevice::kCpu;
  absl::StatusOr<std::string> cpu_frame = cd.Encode(x_host, cpu_opts);
  if (!cpu_frame.ok()) return cpu_frame.status();
  codec::EncodeOptions gpu_opts;
  gpu_opts.device = codec::CodecDevice::kGpu;
  codec::EncodeStats st;
  absl::StatusOr<std::string> frame = cd.Encode(x_dev, gpu_opts, &st);
  if (!frame.ok()) return frame.status();
  r.byte_identical = *frame == *cpu_frame;
  r.bits = static_cast<double>(frame->size()) * 8.0 / static_cast<double>(x_host.numel());
  r.transformed_fraction = st.groups ? static_cast<double>(st.transformed_groups) / st.groups : 0.0;
  codec::DecodeOptions to_dev;
  to_dev.device = dev;
  to_dev.codec_device = codec::CodecDevice::kGpu;
  absl::StatusOr<torch::Tensor> y = codec::DecodeFrame(*frame, to_dev);
  if (!y.ok()) return y.status();
  absl::StatusOr<torch::Tensor> y_cpu = codec::DecodeFrame(*frame, {static_cast<int>(f.threads)});
  if (!y_cpu.ok()) return y_cpu.status();
  const torch::Tensor y_host = y->cpu();
  r.decode_identical = torch::equal(y_host, *y_cpu);
  const torch::Tensor xd = x_host.to(torch::kFloat64);
  r.rel_l2 = ((xd - y_host.to(torch::kFloat64)).norm() / xd.norm()).item<double>();

  absl::StatusOr<codec::FrameView> v = codec::ParseFrame(*frame, codec::DecodeLimits{});
  if (!v.ok()) return v.status();
  const std::vector<int64_t>& shape = v->header.shape;
  const codec::CodecFamily family = codec::CodecTraitsFor(spec->id)->family;
  const auto on_dev = torch::TensorOptions().device(dev);
  torch::Tensor out = torch::empty(shape, on_dev.dtype(torch::kFloat32));
  codec::gpu::Workspace enc_ws, dec_ws;
  std::function<absl::Status()> encode, decode;
  torch::Tensor payload_dev;
  codec::internal::ValidatedPayload validated;
  if (family == codec::CodecFamily::kRaw) {
    // No kernels: encoding is the cast to the wire dtype (a copy when it is the input's), decoding
    // the cast back, both LibTorch's on the device.
    const torch::ScalarType wire = codec::internal::TorchType(codec::CodecTraitsFor(spec->id)->wire_dtype);
    const torch::Tensor w = x_dev.to(wire);
    encode = [&x_dev, wire] {
      (void)x_dev.to(wire, /*non_blocking=*/false, /*copy=*/true);
      return absl::OkStatus();
    };
    decode = [w, t = x_dev.scalar_type()] {
      (void)w.to(t, /*non_blocking=*/false, /*copy=*/true);
      return absl::OkStatus();
    };
  } else {
    // The payload as the decoders take it: validated on the host (as DecodeFrame does), uploaded once.
    absl::StatusOr<codec::internal::ValidatedPayload> vp = codec::internal::ValidatePayload(*v);
    if (!vp.ok()) return vp.status();
    validated = *std::move(vp);
    payload_dev = torch::empty({static_cast<int64_t>(v->payload.size())}, on_dev.dtype(torch::kUInt8));
    if (absl::Status s = codec::gpu::Upload(payload_dev.data_ptr(), v->payload.data(), v->payload.size(), nullptr);
        !s.ok()) {
      return s;
    }
    decode = [&] {
      return codec::internal::DecodeValidatedOnGpu(validated, payload_dev.data_ptr<uint8_t>(), out.data_ptr<float>(),
                                                   dec_ws);
    };
  }
  if (family != codec::CodecFamily::kRaw) {
    // The payload left in device memory (group quant waits for the payload's size, which depends
    // on the data: tahquant's call returns while its encode kernel runs, int<k>'s after it; the
    // other encoders are asynchronous; the round ends with a synchronisation).
    encode = [&] {
      absl::StatusOr<codec::gpu::DeviceBytes> p =
          codec::internal::EncodePayloadOnGpu(*spec, x_dev, shape, 0, enc_ws, nullptr);
      return p.status();
    };
  }
  torch::Tensor copy_dst = torch::empty_like(x_dev);
  auto gbps = [&](absl::StatusOr<double> sec, double* to) {
    if (sec.ok()) *to = bytes / *sec / 1e9;
    return sec.status();
  };
  if (absl::Status s = gbps(DeviceSeconds(f.iters, [&] {
                              return codec::gpu::CopyOnDevice(copy_dst.data_ptr(), x_dev.data_ptr(),
                                                              static_cast<size_t>(x_dev.nbytes()), nullptr);
                            }),
                            &r.copy);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = gbps(DeviceSeconds(f.iters, encode), &r.enc); !s.ok()) return s;
  if (absl::Status s = gbps(DeviceSeconds(f.iters, decode), &r.dec); !s.ok()) return s;
  if (absl::Status s = gbps(DeviceSeconds(f.iters, [&] { return cd.Encode(x_dev, gpu_opts).status(); }), &r.enc_host);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = gbps(DeviceSeconds(f.iters, [&] { return codec::DecodeFrame(*frame, to_dev).status(); }),
                            &r.dec_host);
      !s.ok()) {
    return s;
  }
  if (!f.trace.empty()) {
    // After the figures, in none of them: --iters encodes, then --iters decodes, each kernel's
    // start and end on the GPU's clock (how the dependent launches overlap).
    r.traced = TraceTo(f.trace, dev, [&]() -> absl::Status {
      for (int64_t i = 0; i < f.iters; ++i) {
        if (absl::Status s = encode(); !s.ok()) return s;
      }
      for (int64_t i = 0; i < f.iters; ++i) {
        if (absl::Status s = decode(); !s.ok()) return s;
      }
      return codec::gpu::Synchronize(nullptr);
    });
    if (r.traced.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: %lld encodes and decodes of %s traced into %s\n",
                   static_cast<long long>(f.iters), r.spec.c_str(), f.trace.c_str());
    }
  }
  return r;
}

// The GPU codecs were found available (Run checked before making the data).
int RunOnDevice(const Flags& f, const CLI::App& cmd, const torch::Tensor& x_host, double bytes, const std::string& kind) {
  absl::StatusOr<torch::Device> dev = stage_runtime::ParseDevice(f.device);
  if (!dev.ok()) return common::FlagError(cmd, "--device=" + f.device + ": " + std::string(dev.status().message()));
  if (!dev->is_cuda()) return common::FlagError(cmd, "--device is cpu or cuda:N, not \"" + f.device + "\"");
  const c10::DeviceGuard on_device(*dev);  // the device the GPU codecs' calls below run on
  const torch::Tensor x_dev = x_host.to(*dev).contiguous();
  std::vector<DeviceResult> results;
  for (const std::string& spec : f.codecs) {
    if (!f.json) std::fprintf(stderr, "measuring %s on %s...\n", spec.c_str(), dev->str().c_str());
    absl::StatusOr<DeviceResult> r = MeasureOnDevice(spec, x_host, x_dev, bytes, f);
    if (!r.ok()) {
      std::fprintf(stderr, "longhaul-bench codec: %s on %s: %s\n", spec.c_str(), dev->str().c_str(),
                   std::string(r.status().message()).c_str());
      return 1;
    }
    results.push_back(*std::move(r));
  }
  // After the figures: a failed --trace (the figures stand) makes the exit status 1.
  auto exit_status = [&results]() {
    int status = 0;
    for (const DeviceResult& r : results) {
      if (r.traced.ok()) continue;
      std::fprintf(stderr, "longhaul-bench codec: --trace of %s: %s\n", r.spec.c_str(),
                   std::string(r.traced.message()).c_str());
      status = 1;
    }
    return status;
  };
  const std::string gbps_bytes = absl::StrFormat("input bytes: tokens * hidden * %d (%s) = %.0f per call",
                                                 static_cast<int>(x_host.element_size()), f.dtype, bytes);
  if (f.json) {
    auto one_json = [&](const DeviceResult& r) {
      return nlohmann::ordered_json{
          {"codec", r.spec},
          {"device", dev->str()},
          {"dtype", f.dtype},
          {"tokens", f.tokens},
          {"hidden", f.hidden},
          {"bits_per_element", Round(r.bits, 4)},
          {"rel_l2_error", Round(r.rel_l2, 6)},
          {"byte_identical", r.byte_identical},
          {"decode_identical", r.decode_identical},
          {"encode_gbps", Round(r.enc, 3)},
          {"decode_gbps", Round(r.dec, 3)},
          {"copy_gbps", Round(r.copy, 3)},
          {"encode_vs_copy", Round(r.enc / r.copy, 3)},
          {"decode_vs_copy", Round(r.dec / r.copy, 3)},
          {"encode_to_host_gbps", Round(r.enc_host, 3)},
          {"decode_from_host_gbps", Round(r.dec_host, 3)},
          {"transformed_group_fraction", Round(r.transformed_fraction, 4)},
          {"iters", f.iters},
          {"gbps_bytes", gbps_bytes},
          {"data", kind},
      };
    };
    if (results.size() == 1) {
      std::printf("%s\n", one_json(results[0]).dump().c_str());
      return exit_status();
    }
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const DeviceResult& r : results) all.push_back(one_json(r));
    std::printf("%s\n", nlohmann::ordered_json{{"results", all}}.dump(2).c_str());
    return exit_status();
  }
  std::printf("%lld x %lld %s %s on %s (%.0f MB); GB/s of %s\n", (long long)f.tokens, (long long)f.hidden,
              f.dtype.c_str(), kind.c_str(), dev->str().c_str(), bytes / 1e6, gbps_bytes.c_str());
  std::printf("| codec | bits/elem | rel L2 err | frame = CPU's | decode = CPU's | enc GB/s | dec GB/s | copy GB/s | enc/copy | dec/copy | enc to host GB/s | dec from host GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const DeviceResult& r : results) {
    std::printf("| %s | %.3f | %.4f | %s | %s | %.1f | %.1f | %.1f | %.3f | %.3f | %.2f | %.2f |\n", r.spec.c_str(), r.bits,
                r.rel_l2, r.byte_identical ? "yes" : "NO", r.decode_identical ? "yes" : "NO", r.enc, r.dec, r.copy,
                r.enc / r.copy, r.dec / r.copy, r.enc_host, r.dec_host);
  }
  return exit_status();
}

int Run(const Flags& f, const CLI::App& cmd) {
  if (f.tokens <= 0 || f.hidden <= 0 || f.tokens * f.hidden > (int64_t{1} << 28) || f.threads < 1) {
    return common::FlagError(cmd, "need tokens, hidden, threads >= 1 and tokens * hidden <= 2^28");
  }
  if (f.data != "activations" && f.data != "gradients") {
    return common::FlagError(cmd, "--data is activations or gradients, not \"" + f.data + "\"");
  }
  if (f.dtype != "fp32" && f.dtype != "bf16") return common::FlagError(cmd, "--dtype is fp32 or bf16, not \"" + f.dtype + "\"");
  if (f.iters < 1) return common::FlagError(cmd, "--iters must be >= 1");
  if (!f.trace.empty()) {
    if (f.device == "cpu" || f.codecs.size() != 1) {
      return common::FlagError(cmd, "--trace takes --device=cuda:N and one --codec");
    }
    // Before any measuring: a path that cannot be written fails now, not after the figures.
    if (!std::ofstream(f.trace)) return common::FlagError(cmd, "--trace=" + f.trace + ": cannot write there");
  }
  if (f.device != "cpu") {
    // Checked before the data is made: on a machine without a GPU this fails at once.
    std::string why;
    if (!codec::GpuCodecsAvailable(&why)) {
      return common::FlagError(cmd, "--device=" + f.device + ": the GPU codecs are not available: " + why);
    }
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
  const torch::Tensor x32 = torch::from_blob(data.data(), {f.tokens, f.hidden}, torch::kFloat32);
  const torch::Tensor x = f.dtype == "bf16" ? x32.to(torch::kBFloat16) : x32;
  // Every GB/s figure divides the input's bytes (elements * 4 for fp32, * 2 for bf16).
  const double bytes = static_cast<double>(x.nbytes());
  if (f.device != "cpu") return RunOnDevice(f, cmd, x, bytes, kind);

  std::vector<float> dst(data.size());
  const double memcpy_s = MedianSeconds(f.min_seconds, [&] { std::memcpy(dst.data(), x.data_ptr(), bytes); });
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
    // A 10 Gbit/s link moves 1.25 GB/s of frames, i.e. 1.25 * 32 / bits GB/s of fp32 tensors
    // (1.25 * 16 / bits of bf16 ones).
    const double need = 1.25 * 8.0 * static_cast<double>(x.element_size()) / r.bits;
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
          {"dtype", f.dtype},
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
  std::printf("%lld x %lld %s %s (%.0f MB), %lld outlier channels, SIMD kernels: %s\n",
              (long long)f.tokens, (long long)f.hidden, f.dtype.c_str(), kind.c_str(), bytes / 1e6, (long long)f.outliers,
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
  cmd->add_option("--device", f->device, "cpu, or cuda:N for the GPU codecs (see below)")->type_name("DEVICE");
  cmd->add_option("--dtype", f->dtype, "input dtype: fp32 or bf16 (made from the fp32 data)")->type_name("DTYPE");
  cmd->add_option("--iters", f->iters, "calls per timing round on a device (3 rounds, median)")->type_name("N");
  cmd->add_flag("--json", f->json, "one JSON object per codec instead of a table");
  cmd->add_option("--trace", f->trace,
                  "with --device=cuda:N and one --codec: after the figures, --iters more encodes and decodes "
                  "under LibTorch's profiler, written to FILE as a Chrome trace (each kernel's start and end on "
                  "the GPU; tools/torch-trace-summary.py --timeline; needs a LibTorch with Kineto, as the PyTorch "
                  "wheel's)")
      ->type_name("FILE");
  cmd->footer(
      "Encodes and decodes a synthetic [tokens, hidden] tensor, fp32 or --dtype=bf16 (activations: Gaussian\n"
      "body, --outliers heavy channels, log-normal token energy, 5% spiky tokens; --data=gradients:\n"
      "heavy-tailed synthetic gradients, Student-t, per-row scales, outlier columns, rows are output\n"
      "channels for BitDP; bench/synthetic_data.h) and reports (JSON keys):\n"
      "  bits_per_element   frame bytes * 8 / elements, header and all metadata included\n"
      "  rel_l2_error       ||x - decode(encode(x))|| / ||x||\n"
      "  encode_gbps        GB/s of input, one thread (median of repetitions)\n"
      "  decode_gbps        the same for decoding, into a reused output tensor\n"
      "  decode_alloc_gbps  the same into a freshly allocated tensor (page faults included)\n"
      "  encode_gbps_mt     the same with --threads threads (and decode_gbps_mt)\n"
      "  memcpy_gbps        one-thread memcpy of the input's bytes, measured in this run\n"
      "  threads_for_10gbit threads needed so neither side limits a 10 Gbit/s link\n"
      "Every GB/s figure is the input's bytes (tokens * hidden * 4 for --dtype=fp32, * 2 for bf16)\n"
      "divided by the time of one call.\n"
      "With --device=cuda:N the input is made on the host as above, uploaded once, and the GPU\n"
      "codecs (codec/cuda/) are measured instead (--iters calls per round, 3 rounds, median):\n"
      "  byte_identical        the GPU's frame is byte for byte the CPU's\n"
      "  decode_identical      the GPU's decode of it is bit for bit the CPU's\n"
      "  encode_gbps           device encode, payload left in device memory (raw codecs: the cast)\n"
      "  decode_gbps           device decode of the payload, uploaded once, to fp32 in device memory\n"
      "  copy_gbps             a device-to-device copy of the input, measured in this run\n"
      "  encode_vs_copy        encode_gbps / copy_gbps (and decode_vs_copy)\n"
      "  encode_to_host_gbps   Codec::Encode of the CUDA tensor: encode + copy to the host + CRC\n"
      "  decode_from_host_gbps DecodeFrame of the frame to the device: checks + upload + decode\n"
      "Without the GPU codecs (no nvcc at build time, no GPU) --device=cuda:N fails, saying why.\n"
      "With several --codec, the objects are in {\"results\": [...]}.");
  return [f, cmd] { return Run(*f, *cmd); };
}

}  // namespace longhaul::bench
