// Fuzz target: any byte string through the frame parser and, for symmetric-quant (SDP4Bit/ZeRO++)
// and BitDP frames, the payload validators and decoders, plus the multi-replica BitDP reduction
// and the qWD apply path. (Fuzzing builds skip the CRC check so the fuzzer can reach the payload.)
#include <cstdint>
#include <vector>

#include "codec/bitdp.h"
#include "codec/frame.h"
#include "codec/sdp4bit.h"
#include "codec/sym_quant.h"

using namespace longhaul::codec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DecodeLimits limits;
  limits.max_elements = 1 << 20;
  auto v = ParseFrame(absl::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!v.ok()) return 0;
  std::vector<float> out(static_cast<size_t>(v->numel));
  if (v->header.codec == CodecId::kSymQuant) {
    auto p = SymQuantParams::Parse(v->header.params);
    if (!p.ok()) return 0;
    if (!SymQuantValidate(v->payload, v->numel, *p).ok()) return 0;
    SymQuantDecode(v->payload, v->numel, *p, {}, out.data());
    SymQuantDecode(v->payload, v->numel, *p, {true, true}, out.data());
    (void)QwdApplyShard(v->payload, v->numel, out.data(), *p);
  } else if (v->header.codec == CodecId::kBitDp) {
    const int bits = v->header.params[0];
    const int64_t rows = v->header.shape.empty() ? 1 : v->header.shape[0];
    const int64_t cols = rows == 0 ? 0 : v->numel / rows;
    if (!BitDpValidate(v->payload, rows, cols, bits).ok()) return 0;
    BitDpDecode(v->payload, rows, cols, bits, out.data());
    (void)BitDpReduce({v->payload, v->payload}, rows, cols, bits, BitDpReduction::kApproximate, out.data());
  }
  return 0;
}
