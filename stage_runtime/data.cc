#include "stage_runtime/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::StatusOr<TextDataset> TextDataset::FromDirectory(const std::string& dir, double val_fraction) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("corpus directory ", dir,
                                            " not found (the default corpus comes from Debian's "
                                            "fortunes package: tools/setup.sh installs it)"));
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
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

Batch TextDataset::Sample(Split split, uint64_t seed, int64_t step, int micro_batch, int batch,
                          int context) const {
  const std::string& src = split == Split::kTrain ? train_ : val_;
  const uint64_t s = (seed * 1000003ull + static_cast<uint64_t>(step)) * 1009ull +
                     static_cast<uint64_t>(micro_batch) + (split == Split::kTrain ? 0 : 77777);
  auto gen = at::detail::createCPUGenerator(s);
  const int64_t span = static_cast<int64_t>(src.size()) - context - 1;
  torch::Tensor starts = torch::randint(span, {batch}, gen, torch::kLong);
  torch::Tensor buf = torch::empty({batch, context + 1}, torch::kLong);
  auto a = buf.accessor<int64_t, 2>();
  auto st = starts.accessor<int64_t, 1>();
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t <= context; ++t) a[b][t] = static_cast<uint8_t>(src[st[b] + t]);
  }
  return {buf.slice(1, 0, context).contiguous(), buf.slice(1, 1, context + 1).contiguous()};
}

}  // namespace longhaul::stage_runtime
