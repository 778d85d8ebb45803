// Fuzz target: any byte string through the frame parser and, for grouped-quant frames, the payload
// validator and decoder. (Fuzzing builds skip the CRC check so the fuzzer can reach the payload.)
// Also FrameCrc, the receive path's checksum-on-arrival, fed the same bytes in three pieces: it
// must not read past them whatever the header says, and on every frame ParseFrame accepts it must
// equal the CRC of the bytes ParseFrame checks.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "codec/group_quant.h"

using namespace longhaul::codec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DecodeLimits limits;
  limits.max_elements = 1 << 20;
  auto v = ParseFrame(absl::string_view(reinterpret_cast<const char*>(data), size), limits);
  const size_t a = size == 0 ? 0 : data[size - 1] % (size + 1), b = a + (size - a) / 2;
  FrameCrc pieces;
  pieces.Update(data, a);
  pieces.Update(data + a, b - a);
  pieces.Update(data + b, size - b);
  if (v.ok()) {
    const size_t header = FrameHeaderBytes(static_cast<int>(v->header.shape.size()));
    const uint32_t want = Crc32cExtend(Crc32c(data, header - 4), data + header, size - header);
    if (!pieces.Value().has_value() || *pieces.Value() != want) std::abort();
  }
  if (!v.ok()) return 0;
  if (v->header.codec != CodecId::kIntK && v->header.codec != CodecId::kTahQuant) return 0;
  auto p = GroupQuantParams::Parse(v->header.params);
  if (!p.ok()) return 0;
  const int64_t dim = v->header.shape.empty() ? 1 : v->header.shape.back();
  const int64_t tokens = dim == 0 ? 0 : v->numel / dim;
  auto layout = GroupQuantValidate(v->payload, tokens, dim, *p);
  if (!layout.ok()) return 0;
  std::vector<float> out(static_cast<size_t>(v->numel));
  GroupQuantDecode(v->payload, *layout, tokens, dim, *p, 1, BestKernels(), out.data());
  GroupQuantDecode(v->payload, *layout, tokens, dim, *p, 1, ScalarKernels(), out.data());
  return 0;
}
