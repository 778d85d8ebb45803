#include "stage_runtime/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "stage_runtime/safetensors_header.h"

namespace longhaul::stage_runtime {
namespace {


absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const TensorFile& file) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::vector<torch::Tensor> data;
  for (const auto& [name, t] : file.tensors) {
    torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const uint64_t n = c.nbytes();
    header[name] = {{"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    data.push_back(c);
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("create ", tmp, ": ", std::strerror(errno)));
  const uint64_t hn = h.size();
  absl::Status s = WriteAll(fd, &hn, 8, tmp);
  if (s.ok()) s = WriteAll(fd, h.data(), h.size(), tmp);
  for (const auto& c : data) {
    if (s.ok()) s = WriteAll(fd, c.data_ptr(), c.nbytes(), tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", std::strerror(errno)));
  ::close(fd);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", std::strerror(errno)));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path));
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", why));
  };
  uint64_t hn = 0;
  if (size >= 8) in.read(reinterpret_cast<char*>(&hn), 8);
  if (absl::Status s = CheckSafetensorsHeaderLength(hn, size); !s.ok()) return bad(std::string(s.message()));
  std::string h(hn, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hn));
  absl::StatusOr<nlohmann::json> parsed = ParseSafetensorsHeader(h);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::json& header = *parsed;
  const uint64_t data_size = size - 8 - hn;
  TensorFile f;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it->begin(); m != it->end(); ++m) f.metadata[m.key()] = m->get<std::string>();
        continue;
      }
      const nlohmann::json& e = *it;
      if (e.value("dtype", "") != "F32") return bad(absl::StrCat("tensor ", it.key(), ": dtype is not F32"));
      std::vector<int64_t> shape = e.at("shape").get<std::vector<int64_t>>();
      std::vector<uint64_t> off = e.at("data_offsets").get<std::vector<uint64_t>>();
      uint64_t numel = 1;
      for (int64_t d : shape) {
        if (d < 0 || (d > 0 && numel > (data_size / 4) / static_cast<uint64_t>(d))) {
          return bad(absl::StrCat("tensor ", it.key(), ": shape larger than the file"));
        }
        numel *= static_cast<uint64_t>(d);
      }
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size || off[1] - off[0] != numel * 4) {
        return bad(absl::StrCat("tensor ", it.key(), ": data offsets do not match its shape or the file (truncated?)"));
      }
      torch::Tensor t = torch::empty(shape, torch::kFloat32);
      in.seekg(static_cast<std::streamoff>(8 + hn + off[0]));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(numel * 4));
      if (!in) return bad(absl::StrCat("tensor ", it.key(), ": read failed"));
      f.tensors[it.key()] = t;
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("malformed header entry: ", e.what()));
  }
  return f;
}

}  // namespace longhaul::stage_runtime
