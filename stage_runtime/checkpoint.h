// safetensors files: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the raw little-endian tensor bytes. Written atomically: a temp file in the same directory,
// fsync, rename. Only F32 tensors (what the stage runtime stores).
#ifndef LONGHAUL_STAGE_RUNTIME_CHECKPOINT_H_
#define LONGHAUL_STAGE_RUNTIME_CHECKPOINT_H_

#include <map>
#include <string>

#include <torch/torch.h>

#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

struct TensorFile {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

absl::Status WriteSafetensors(const std::string& path, const TensorFile& file);
// Rejects truncated files, malformed headers, unknown dtypes, and offsets or shapes that do not
// match the data, with the tensor's name in the message.
absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_CHECKPOINT_H_
