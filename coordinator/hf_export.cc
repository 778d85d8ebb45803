#include "coordinator/hf_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stage_runtime/safetensors_header.h"

namespace longhaul::coordinator {
namespace {

// What stage_runtime/executor.cc writes in every stage checkpoint's metadata. Another format is a
// model this exporter does not know.
constexpr char kStageFormat[] = "longhaul-stage-v1";
constexpr char kOptimizerPrefix[] = "__optim__.";

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

std::string Errno() { return std::strerror(errno); }

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct SourceTensor {
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute file offset of the data
  uint64_t bytes = 0;
};

// One stage checkpoint's header: where each tensor lies, not the data. The file stays open until
// the export is done: a running job's worker may replace it (a new checkpoint, renamed over the
// old one) meanwhile, and the data must come from the file the header was read from.
struct SourceFile {
  std::string path;
  std::shared_ptr<Fd> fd;
  int stage = 0;
  int64_t step = 0;
  std::map<std::string, SourceTensor> tensors;  // model parameters only (no optimizer state)
};

absl::StatusOr<SourceFile> ReadHeader(const HfStageCheckpoint& c) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("stage ", c.stage, " checkpoint ", c.path, ": ", why));
  };
  auto fd = std::make_shared<Fd>(::open(c.path.c_str(), O_RDONLY | O_CLOEXEC));
  const Fd& f = *fd;
  if (f.fd < 0) {
    return absl::NotFoundError(absl::StrCat("stage ", c.stage, " checkpoint ", c.path, ": ", Errno()));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return bad(Errno());
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t hn = 0;
  if (size < 8 || ::pread(f.fd, &hn, 8, 0) != 8) return bad("truncated (no header length)");
  if (absl::Status s = stage_runtime::CheckSafetensorsHeaderLength(hn, size); !s.ok()) {
    return bad(std::string(s.message()));
  }
  std::string h(hn, '\0');
  if (::pread(f.fd, h.data(), hn, 8) != static_cast<ssize_t>(hn)) return bad("truncated header");
  absl::StatusOr<nlohmann::json> parsed = stage_runtime::ParseSafetensorsHeader(h);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::json& header = *parsed;
  SourceFile out{c.path, fd, c.stage, 0, {}};
  const uint64_t data_begin = 8 + hn, data_size = size - data_begin;
  try {
    const nlohmann::json meta = header.value("__metadata__", nlohmann::json::object());
    if (meta.value("format", "") != kStageFormat) {
      return bad(absl::StrCat("not a longhaul stage checkpoint of a known format (metadata format \"",
                              meta.value("format", ""), "\", expected \"", kStageFormat, "\")"));
    }
    const std::string step = meta.value("step", "");
    try {
      size_t used = 0;
      out.step = std::stoll(step, &used);
      if (used != step.size() || out.step < 0) throw std::invalid_argument("step");
    } catch (const std::exception&) {
      return bad(absl::StrCat("bad step \"", step, "\" in its metadata"));
    }
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__" || name.rfind(kOptimizerPrefix, 0) == 0) continue;
      const nlohmann::json& e = *it;
      if (e.value("dtype", "") != "F32") {
        return bad(absl::StrCat("tensor ", name, " has dtype ", e.value("dtype", "?"), ", expected F32"));
      }
      SourceTensor t;
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 0 || (d > 0 && numel > (data_size / 4) / static_cast<uint64_t>(d))) {
          return bad(absl::StrCat("tensor ", name, ": shape ", Shape(t.shape), " is larger than the file"));
        }
        numel *= static_cast<uint64_t>(d);
      }
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size || off[1] - off[0] != numel * 4) {
        return bad(absl::StrCat("tensor ", name, ": data offsets do not match its shape or the file (truncated?)"));
      }
      t.begin = data_begin + off[0];
      t.bytes = numel * 4;
      out.tensors[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("malformed header entry: ", e.what()));
  }
  return out;
}

// One tensor of model.safetensors and where its data comes from.
struct OutTensor {
  std::string name;                 // Hugging Face name
  const SourceFile* src = nullptr;
  std::string src_name;             // longhaul name
  std::vector<int64_t> shape;       // Hugging Face shape
  bool transpose = false;           // torch Linear [out, in] -> HF Conv1D [in, out]
};

// Checks that `f` holds exactly the tensors of its stage with GPT-2's shapes, and appends them to
// `plan` under their Hugging Face names.
absl::Status PlanStage(const HfModelShape& m, const HfStageCheckpoint& c, bool first, bool last,
                       const SourceFile& f, std::vector<OutTensor>& plan) {
  const int64_t H = m.hidden, V = m.vocab, T = m.context;
  std::map<std::string, bool> used;
  auto take = [&](const std::string& name, std::vector<int64_t> shape, const std::string& hf_name,
                  bool transpose) -> absl::Status {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      return absl::DataLossError(absl::StrCat("stage ", c.stage, " checkpoint ", f.path, " lacks tensor ", name,
                                              " (the stage holds blocks ", c.layer_begin, "..", c.layer_end - 1,
                                              first ? ", the embeddings" : "", last ? ", ln_f and lm_head" : "",
                                              ")"));
    }
    if (it->second.shape != shape) {
      return absl::DataLossError(absl::StrCat("stage ", c.stage, " checkpoint ", f.path, ": tensor ", name,
                                              " has shape ", Shape(it->second.shape), ", the job's model (layers ",
                                              m.layers, ", hidden ", H, ", context ", T, ", vocab ", V,
                                              ") needs ", Shape(shape)));
    }
    used[name] = true;
    if (transpose) std::swap(shape[0], shape[1]);
    plan.push_back({hf_name, &f, name, shape, transpose});
    return absl::OkStatus();
  };
  absl::Status s;
  if (first) {
    if (s = take("wte.weight", {V, H}, "transformer.wte.weight", false); !s.ok()) return s;
    if (s = take("wpe.weight", {T, H}, "transformer.wpe.weight", false); !s.ok()) return s;
  }
  for (int i = c.layer_begin; i < c.layer_end; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    struct Param {
      const char* name;
      std::vector<int64_t> shape;
      bool transpose;
    };
    const Param params[] = {
        {"ln_1.weight", {H}, false},         {"ln_1.bias", {H}, false},
        {"attn.c_attn.weight", {3 * H, H}, true}, {"attn.c_attn.bias", {3 * H}, false},
        {"attn.c_proj.weight", {H, H}, true},     {"attn.c_proj.bias", {H}, false},
        {"ln_2.weight", {H}, false},         {"ln_2.bias", {H}, false},
        {"mlp.c_fc.weight", {4 * H, H}, true},    {"mlp.c_fc.bias", {4 * H}, false},
        {"mlp.c_proj.weight", {H, 4 * H}, true},  {"mlp.c_proj.bias", {H}, false},
    };
    for (const Param& q : params) {
      if (s = take(p + q.name, q.shape, "transformer." + p + q.name, q.transpose); !s.ok()) return s;
    }
  }
  if (last) {
    if (s = take("ln_f.weight", {H}, "transformer.ln_f.weight", false); !s.ok()) return s;
    if (s = take("ln_f.bias", {H}, "transformer.ln_f.bias", false); !s.ok()) return s;
    if (s = take("lm_head.weight", {V, H}, "lm_head.weight", false); !s.ok()) return s;
  }
  for (const auto& [name, t] : f.tensors) {
    if (!used.count(name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", c.stage, " checkpoint ", f.path, " holds tensor ", name, " ", Shape(t.shape),
          ", which has no place in a GPT-2 stage holding blocks ", c.layer_begin, "..", c.layer_end - 1,
          ": the model differs from the one this exporter knows (or the stage's layers differ from the "
          "job record); refusing to write a model that would compute something else"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write ", path, ": ", Errno()));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Writes `contents` to `path` through a temporary file and a rename (readers never see half a file).
// `fill` writes the contents to the open descriptor.
template <typename Fill>
absl::Status WriteAtomically(const std::string& path, Fill fill) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("create ", tmp, ": ", Errno()));
  absl::Status s = fill(fd, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", Errno()));
  if (::close(fd) != 0 && s.ok()) s = absl::InternalError(absl::StrCat("close ", tmp, ": ", Errno()));
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", Errno()));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

// Copies one tensor's data, transposing [rows, cols] to [cols, rows] if asked; rejects NaN and Inf
// (a diverged run; its export would only produce NaN logits).
absl::Status CopyTensor(const OutTensor& t, int out_fd, const std::string& out_path) {
  const int in = t.src->fd->fd;
  const SourceTensor& st = t.src->tensors.at(t.src_name);
  const size_t n = st.bytes / 4;
  std::vector<float> buf(n);
  for (uint64_t done = 0; done < st.bytes;) {
    const ssize_t r = ::pread(in, reinterpret_cast<char*>(buf.data()) + done, st.bytes - done,
                              static_cast<off_t>(st.begin + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DataLossError(absl::StrCat("read ", t.src_name, " from ", t.src->path, ": ",
                                                        r < 0 ? Errno() : "unexpected end of file"));
    done += static_cast<uint64_t>(r);
  }
  for (float v : buf) {
    if (!std::isfinite(v)) {
      return absl::DataLossError(absl::StrCat("stage ", t.src->stage, " checkpoint ", t.src->path, ": tensor ",
                                              t.src_name, " holds NaN or Inf (the training diverged?)"));
    }
  }
  if (!t.transpose) return WriteAll(out_fd, buf.data(), st.bytes, out_path);
  // Source [rows, cols] row-major; in 32x32 tiles so that both sides stay in cache.
  const size_t rows = static_cast<size_t>(st.shape[0]), cols = static_cast<size_t>(st.shape[1]);
  std::vector<float> tr(n);
  constexpr size_t kTile = 32;
  for (size_t r0 = 0; r0 < rows; r0 += kTile) {
    for (size_t c0 = 0; c0 < cols; c0 += kTile) {
      for (size_t r = r0; r < std::min(rows, r0 + kTile); ++r) {
        for (size_t c = c0; c < std::min(cols, c0 + kTile); ++c) tr[c * rows + r] = buf[r * cols + c];
      }
    }
  }
  return WriteAll(out_fd, tr.data(), st.bytes, out_path);
}

nlohmann::ordered_json Config(const HfExport& e, int64_t step) {
  const HfModelShape& m = e.model;
  nlohmann::ordered_json longhaul = {{"job_id", e.job_id}, {"job_name", e.job_name}, {"step", step},
                                     {"data_format", e.data_format}};
  if (e.data_format == "text") longhaul["tokens"] = "UTF-8 bytes: token id = byte value (no tokenizer needed)";
  if (e.data_format == "tokens-u16") {
    longhaul["tokens"] = "ids of the SentencePiece model `longhaul-data prepare` wrote next to the token files";
  }
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab},
      {"n_positions", m.context},
      {"n_embd", m.hidden},
      {"n_layer", m.layers},
      {"n_head", m.heads},
      {"n_inner", nullptr},  // 4 * n_embd
      {"activation_function", "gelu_new"},  // GELU, tanh approximation
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", false},
      // The training data has no special tokens (GPT-2's 50256 may not even be in the vocabulary).
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"torch_dtype", "float32"},
      {"longhaul", longhaul},
  };
}

absl::Status CheckLayout(const HfExport& e) {
  const HfModelShape& m = e.model;
  if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.context < 1 || m.vocab < 1) {
    return absl::InvalidArgumentError("model layers, hidden, heads, context and vocab must be >= 1");
  }
  if (m.hidden % m.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hidden ", m.hidden, " is not divisible by heads ", m.heads));
  }
  if (e.stages.empty()) return absl::InvalidArgumentError("no stages to export");
  int next = 0;
  for (size_t i = 0; i < e.stages.size(); ++i) {
    const HfStageCheckpoint& c = e.stages[i];
    if (c.stage != static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", i, " is missing (got stage ", c.stage, " in its place)"));
    }
    if (c.layer_begin != next || c.layer_end <= c.layer_begin) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", i, " holds blocks [", c.layer_begin, ", ", c.layer_end,
                                                     "), expected a non-empty range starting at ", next));
    }
    next = c.layer_end;
  }
  if (next != m.layers) {
    return absl::InvalidArgumentError(absl::StrCat("the stages hold blocks 0..", next - 1, ", the model has ",
                                                   m.layers, " layers"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfExportResult> ExportHuggingFaceGpt2(const HfExport& e) {
  if (absl::Status s = CheckLayout(e); !s.ok()) return s;
  // Every header first: nothing is written unless every stage checks out.
  std::vector<std::unique_ptr<SourceFile>> files;
  for (const HfStageCheckpoint& c : e.stages) {
    absl::StatusOr<SourceFile> f = ReadHeader(c);
    if (!f.ok()) return f.status();
    files.push_back(std::make_unique<SourceFile>(*std::move(f)));
  }
  for (const auto& f : files) {
    if (f->step != files[0]->step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the stages' checkpoints are from different steps (stage 0: step ", files[0]->step, ", stage ", f->stage,
          ": step ", f->step, "): a running job is writing its checkpoints, or the files come from different "
          "runs; try again after the next checkpoint"));
    }
  }
  std::vector<OutTensor> plan;
  const int n = static_cast<int>(e.stages.size());
  for (int i = 0; i < n; ++i) {
    if (absl::Status s = PlanStage(e.model, e.stages[i], i == 0, i == n - 1, *files[i], plan); !s.ok()) return s;
  }

  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  HfExportResult result;
  result.step = files[0]->step;
  for (const OutTensor& t : plan) {
    const uint64_t bytes = t.src->tensors.at(t.src_name).bytes;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    result.parameters += static_cast<int64_t>(bytes / 4);
  }
  // transformers refuses safetensors files whose metadata does not name a framework.
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section, as safetensors' own writer does
  result.bytes = 8 + h.size() + offset;

  std::error_code ec;
  std::filesystem::create_directories(e.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", e.out_dir, ": ", ec.message()));
  absl::Status s = WriteAtomically(e.out_dir + "/model.safetensors", [&](int fd, const std::string& path) {
    const uint64_t hn = h.size();
    absl::Status w = WriteAll(fd, &hn, 8, path);
    if (w.ok()) w = WriteAll(fd, h.data(), h.size(), path);
    for (const OutTensor& t : plan) {
      if (w.ok()) w = CopyTensor(t, fd, path);
    }
    return w;
  });
  if (!s.ok()) return s;
  const std::string config = Config(e, result.step).dump(2) + "\n";
  s = WriteAtomically(e.out_dir + "/config.json", [&](int fd, const std::string& path) {
    return WriteAll(fd, config.data(), config.size(), path);
  });
  if (!s.ok()) return s;
  return result;
}

}  // namespace longhaul::coordinator
