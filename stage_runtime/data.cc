#include "stage_runtime/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/list_dir.h"

namespace longhaul::stage_runtime {
namespace {

// The start offsets of a batch's sequences: uniform over the split, reproducible from (seed, step,
// micro-batch, split). Shared by both formats so that they sample alike.
torch::Tensor Starts(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int64_t span) {
  const uint64_t s = (seed * 1000003ull + static_cast<uint64_t>(step)) * 1009ull +
                     static_cast<uint64_t>(micro_batch) + (split == Split::kTrain ? 0 : 77777);
  auto gen = at::detail::createCPUGenerator(s);
  return torch::randint(span, {batch}, gen, torch::kLong);
}

// Tokens [start, start + context] of each sequence, split into inputs and labels shifted by one.
template <typename Get>
Batch Gather(const torch::Tensor& starts, int batch, int context, Get&& get) {
  torch::Tensor buf = torch::empty({batch, context + 1}, torch::kLong);
  auto a = buf.accessor<int64_t, 2>();
  auto st = starts.accessor<int64_t, 1>();
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t <= context; ++t) a[b][t] = get(st[b] + t);
  }
  return {buf.slice(1, 0, context).contiguous(), buf.slice(1, 1, context + 1).contiguous()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const DataSpec& spec, int context) {
  if (spec.format == "text") {
    if (spec.vocab < 256) {
      return absl::InvalidArgumentError(absl::StrCat("byte-level text needs a vocab of at least 256, the model has ", spec.vocab));
    }
    absl::StatusOr<TextDataset> d = TextDataset::FromPath(spec.path, spec.val_fraction);
    if (!d.ok()) return d.status();
    if (d->val_tokens() <= context + 1 || d->train_tokens() <= context + 1) {
      return absl::InvalidArgumentError(absl::StrCat("corpus ", spec.path, " is too small for sequences of ", context, " bytes"));
    }
    return std::unique_ptr<Dataset>(new TextDataset(std::move(*d)));
  }
  if (spec.format == "tokens-u16") {
    absl::StatusOr<std::unique_ptr<TokenFileDataset>> d = TokenFileDataset::Open(spec.path, spec.vocab, context);
    if (!d.ok()) return d.status();
    return std::unique_ptr<Dataset>(std::move(*d));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown data format \"", spec.format, "\" (text or tokens-u16)"));
}

absl::StatusOr<TextDataset> TextDataset::FromPath(const std::string& path, double val_fraction) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else if (fs::is_directory(path, ec)) {
    absl::StatusOr<std::vector<std::string>> in_dir = common::ListRegularFiles(path, ".dat");
    if (!in_dir.ok()) return in_dir.status();
    files = *std::move(in_dir);
  } else {
    return absl::NotFoundError(absl::StrCat("corpus ", path,
                                            " not found: neither a file nor a directory (the default corpus comes "
                                            "from Debian's fortunes package: tools/setup.sh installs it)"));
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", f));
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  return FromText(std::move(text), val_fraction);
}

absl::StatusOr<TextDataset> TextDataset::FromText(std::string text, double val_fraction) {
  if (!(val_fraction > 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError("validation fraction must be in (0, 1)");
  }
  if (text.size() < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("corpus has only ", text.size(), " bytes; need at least 4096"));
  }
  TextDataset d;
  const size_t cut = static_cast<size_t>(text.size() * (1.0 - val_fraction));
  d.val_ = text.substr(cut);
  text.resize(cut);
  d.train_ = std::move(text);
  return d;
}

Batch TextDataset::Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch, int context) const {
  const std::string& src = split == Split::kTrain ? train_ : val_;
  const torch::Tensor starts =
      Starts(split, seed, step, micro_batch, batch, static_cast<int64_t>(src.size()) - context - 1);
  return Gather(starts, batch, context, [&src](int64_t i) -> int64_t { return static_cast<uint8_t>(src[i]); });
}

absl::Status TokenFileDataset::Map(const std::string& path, int vocab, int context, Mapped* out) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("token file ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("token file ", path, ": ", std::strerror(e)));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes % 2 != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " has ", bytes,
                                                   " bytes, not a whole number of uint16 tokens"));
  }
  const int64_t tokens = static_cast<int64_t>(bytes / 2);
  if (tokens < int64_t{context} + 2) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " holds ", tokens,
                                                   " tokens, too few for one sequence of ", context, " + 1"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  const auto* data = static_cast<const uint16_t*>(p);
  // Every token is checked once here, so that sampling never has to (the scan runs at memory speed).
  for (int64_t i = 0; i < tokens; ++i) {
    if (data[i] >= vocab) {
      const uint16_t bad = data[i];
      ::munmap(p, bytes);
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": token ", bad, " at offset ", i,
                                                     " (byte ", 2 * i, ") is >= the model's vocab ", vocab));
    }
  }
  out->data = data;
  out->tokens = tokens;
  out->bytes = bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenFileDataset>> TokenFileDataset::Open(const std::string& dir, int vocab,
                                                                         int context) {
  if (vocab < 1 || vocab > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("uint16 token files need a vocab of 1..65536, got ", vocab));
  }
  std::unique_ptr<TokenFileDataset> d(new TokenFileDataset());
  if (absl::Status s = Map(dir + "/train.bin", vocab, context, &d->train_); !s.ok()) return s;
  if (absl::Status s = Map(dir + "/val.bin", vocab, context, &d->val_); !s.ok()) return s;
  return d;
}

TokenFileDataset::~TokenFileDataset() {
  for (const Mapped* m : {&train_, &val_}) {
    if (m->data != nullptr) ::munmap(const_cast<uint16_t*>(m->data), m->bytes);
  }
}

Batch TokenFileDataset::Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch,
                               int context) const {
  const Mapped& m = split == Split::kTrain ? train_ : val_;
  const torch::Tensor starts = Starts(split, seed, step, micro_batch, batch, m.tokens - context - 1);
  return Gather(starts, batch, context, [&m](int64_t i) -> int64_t { return m.data[i]; });
}

}  // namespace longhaul::stage_runtime
