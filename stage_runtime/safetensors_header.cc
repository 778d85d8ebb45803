#include "stage_runtime/safetensors_header.h"

#include "absl/strings/str_cat.h"

namespace longhaul::stage_runtime {

absl::Status CheckSafetensorsHeaderLength(uint64_t header_len, uint64_t file_size) {
  if (file_size < 8) return absl::DataLossError("truncated (no header length)");
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > file_size - 8) {
    return absl::DataLossError(
        absl::StrCat("header length ", header_len, " exceeds the file (", file_size, " bytes) or the limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseSafetensorsHeader(const std::string& text) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return absl::DataLossError("header is not a JSON object");
  return header;
}

}  // namespace longhaul::stage_runtime
