// The header of a safetensors file (8-byte little-endian length, then a JSON object), checked the
// same way by the checkpoint loader (checkpoint.h, LibTorch) and the Hugging Face exporter
// (coordinator/hf_export.h, no LibTorch): this part needs neither.
//
//   if (absl::Status s = CheckSafetensorsHeaderLength(hn, file_size); !s.ok()) return bad(s.message());
//   absl::StatusOr<nlohmann::json> header = ParseSafetensorsHeader(text);
#ifndef LONGHAUL_STAGE_RUNTIME_SAFETENSORS_HEADER_H_
#define LONGHAUL_STAGE_RUNTIME_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::stage_runtime {

// The largest header read (a hostile length must not allocate gigabytes).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 64ull << 20;

// Whether a header of `header_len` bytes fits a file of `file_size` bytes and the limit; the
// message (without context) says why not.
absl::Status CheckSafetensorsHeaderLength(uint64_t header_len, uint64_t file_size);

// The header's JSON, which must be an object; the message says what is wrong.
absl::StatusOr<nlohmann::json> ParseSafetensorsHeader(const std::string& text);

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_SAFETENSORS_HEADER_H_
