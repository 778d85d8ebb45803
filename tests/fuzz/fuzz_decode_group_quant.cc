// Fuzz target: grouped-quant payloads with fuzzer-chosen shape and parameters. The first 8 bytes
// pick tokens, dim, group size, bit widths and flags; the rest is the payload.
#include <cstdint>
#include <vector>

#include "codec/group_quant.h"

using namespace longhaul::codec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  GroupQuantParams p;
  const int64_t tokens = data[0] % 16;
  const int64_t dim = 1 + (data[1] | (data[2] << 8)) % 600;
  p.group_size = 8 << (data[3] % 6);
  p.bits_hi = 2 + data[4] % 7;
  p.bits_lo = 2 + data[5] % 7;
  p.adaptive = data[6] & 1;
  p.hadamard = data[6] & 2;
  if (!p.Validate().ok()) return 0;
  const absl::string_view payload(reinterpret_cast<const char*>(data + 8), size - 8);
  auto layout = GroupQuantValidate(payload, tokens, dim, p);
  if (!layout.ok()) return 0;
  std::vector<float> out(static_cast<size_t>(tokens * dim));
  GroupQuantDecode(payload, *layout, tokens, dim, p, 1, BestKernels(), out.data());
  return 0;
}
