#include "collective/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/bitdp.h"
#include "codec/sym_quant.h"
#include "collective/algorithms.h"

namespace longhaul::collective {

namespace {

absl::Status BadPayload(const Op& op, int peer, absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(op.PeerName(peer), " sent a bad ", what, ": ", s.message()));
}

// BitDP's full-precision segments (biases, norms) are small and never quantised: their ring
// shards need no group alignment, only whole cache lines.
constexpr int64_t kPlainAlign = 16;
int Bits(DpCodec c) { return c == DpCodec::kBitDp1 ? 1 : 2; }
bool IsBitDp(DpCodec c) { return c == DpCodec::kBitDp1 || c == DpCodec::kBitDp2; }

// Bytes rank `me` sends in a two-level all-gather of blobs of blob_bytes[k] bytes.
int64_t AllGatherBytesSent(const Topology& topo, int me, const std::vector<int64_t>& blob_bytes) {
  const int y = topo.region(me);
  int64_t forwarded = 0;
  for (int k : ForwardedBlobs(topo, me)) forwarded += blob_bytes[k];
  return (topo.num_regions() - 1) * blob_bytes[me] +
         static_cast<int64_t>(topo.members(y).size() - 1) * forwarded;
}

}  // namespace

std::vector<BitDpSegment> BitDpLayoutFor(const std::vector<ParamShape>& params) {
  std::vector<BitDpSegment> out;
  for (const ParamShape& p : params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    if (numel <= 0) continue;
    if (codec::BitDpAppliesTo(p.name, p.shape)) {
      out.push_back({p.shape[0], p.shape[1], true});
    } else {
      out.push_back({1, numel, false});
    }
  }
  return out;
}

absl::StatusOr<DpCodec> ParseDpCodec(absl::string_view name) {
  for (DpCodec c : {DpCodec::kFp32, DpCodec::kSdp4Bit, DpCodec::kZeroPP, DpCodec::kBitDp1, DpCodec::kBitDp2}) {
    if (name == DpCodecName(c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data-parallel codec '", name, "' (fp32, sdp4bit, zeropp, bitdp1, bitdp2)"));
}

const char* DpCodecName(DpCodec c) {
  switch (c) {
    case DpCodec::kFp32: return "fp32";
    case DpCodec::kSdp4Bit: return "sdp4bit";
    case DpCodec::kZeroPP: return "zeropp";
    case DpCodec::kBitDp1: return "bitdp1";
    case DpCodec::kBitDp2: return "bitdp2";
  }
  return "?";
}

DpOptions DefaultDpOptions(DpCodec c) {
  DpOptions o;
  o.codec = c;
  if (c == DpCodec::kZeroPP) {
    o.grad = codec::Ulq();
    o.weights = {4, 2048, false, codec::Rounding::kNearest};
  }
  return o;
}

absl::StatusOr<std::unique_ptr<DataParallelSync>> DataParallelSync::Create(Group* group, int64_t n, DpOptions o) {
  if (n < 0) return absl::InvalidArgumentError("a negative element count");
  if (o.codec == DpCodec::kSdp4Bit || o.codec == DpCodec::kZeroPP) {
    for (const codec::SymQuantParams& p : {o.grad.Fast(), o.grad.Slow(), o.weights}) {
      if (absl::Status s = p.Validate(); !s.ok()) return s;
    }
  }
  if (o.buckets < 1 || o.buckets > kMaxBuckets) {
    return absl::InvalidArgumentError(absl::StrCat(o.buckets, " buckets (1 to ", kMaxBuckets, ")"));
  }
  if (IsBitDp(o.codec)) {
    if (o.bitdp_layout.empty()) o.bitdp_layout.push_back({1, n, true});
    int64_t total = 0;
    for (const BitDpSegment& s : o.bitdp_layout) {
      if (s.rows < 1 || s.cols < 1) {
        return absl::InvalidArgumentError(absl::StrCat("a BitDP segment of ", s.rows, " x ", s.cols));
      }
      total += s.rows * s.cols;
    }
    if (total != n) {
      return absl::InvalidArgumentError(absl::StrCat("the BitDP segments cover ", total, " elements of ", n));
    }
  }
  return std::unique_ptr<DataParallelSync>(new DataParallelSync(group, n, std::move(o)));
}

DataParallelSync::DataParallelSync(Group* g, int64_t n, DpOptions o)
    : g_(g), n_(n), o_(std::move(o)), layout_(g->Shards(n)) {}

int64_t DataParallelSync::owned_begin() const { return IsBitDp(o_.codec) ? 0 : layout_.begin(g_->rank()); }
int64_t DataParallelSync::owned_length() const { return IsBitDp(o_.codec) ? n_ : layout_.length(g_->rank()); }

absl::Status DataParallelSync::Restore(absl::Span<const float> main, uint64_t steps) {
  if (IsBitDp(o_.codec) || static_cast<int64_t>(main.size()) != owned_length()) {
    return absl::InvalidArgumentError(absl::StrCat("restoring ", main.size(), " main weights; rank ", g_->rank(),
                                                   " of a ", DpCodecName(o_.codec), " sync keeps ",
                                                   IsBitDp(o_.codec) ? 0 : owned_length()));
  }
  main_.assign(main.begin(), main.end());
  steps_ = steps;
  return absl::OkStatus();
}

int64_t DataParallelSync::WeightPayloadBytes(int k) const {
  return static_cast<int64_t>(codec::SymQuantPayloadBytes(layout_.length(k), o_.weights));
}

int64_t DataParallelSync::ExpectedBytesSent() const {
  const Topology& topo = g_->topology();
  const int P = topo.size(), me = g_->rank(), y = topo.region(me);
  auto ring_bytes = [P](int64_t elements, int64_t align) {
    return 2 * (P - 1) * MakeShards(elements, P, align).chunk * 4;
  };
  if (o_.codec == DpCodec::kFp32) return ring_bytes(n_, kShardAlign);
  if (IsBitDp(o_.codec)) {
    int64_t payload = 0, plain = 0;
    for (const BitDpSegment& s : o_.bitdp_layout) {
      if (s.quantise) {
        payload += static_cast<int64_t>(codec::BitDpPayloadBytes(s.rows, s.cols, Bits(o_.codec)));
      } else {
        plain += s.rows * s.cols;
      }
    }
    return AllGatherBytesSent(topo, me, std::vector<int64_t>(static_cast<size_t>(P), payload)) +
           (plain > 0 ? ring_bytes(plain, kPlainAlign) : 0);
  }
  const int64_t c = layout_.chunk;
  int64_t bytes = 0;
  for (int m : topo.members(y)) {
    if (m == me) continue;
    const int64_t pieces = static_cast<int64_t>(CarriedShards(topo, y, m).size());
    bytes += pieces * static_cast<int64_t>(codec::SymQuantPayloadBytes(c, o_.grad.Fast()));
  }
  const int64_t slow_msgs = static_cast<int64_t>(CarriedShards(topo, y, me).size()) - 1;
  bytes += slow_msgs * static_cast<int64_t>(codec::SymQuantPayloadBytes(c, o_.grad.Slow()));
  std::vector<int64_t> blob(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k) blob[k] = WeightPayloadBytes(k);
  return bytes + AllGatherBytesSent(topo, me, blob);
}

absl::StatusOr<CallStats> DataParallelSync::Step(absl::Span<const float> grad, absl::Span<float> weights,
                                                 const UpdateFn& update) {
  absl::StatusOr<Op> op = g_->Begin(absl::StrCat("dp-step-", DpCodecName(o_.codec)), n_);
  if (!op.ok()) return op.status();
  absl::Status s;
  // The update's time, apart from the sync's own (CallStats::update).
  absl::Duration in_update = absl::ZeroDuration();
  const UpdateFn timed = [&](int64_t off, absl::Span<const float> sum, absl::Span<float> main) {
    const absl::Time t0 = absl::Now();
    CallStats& st = op->stats();
    if (st.update_start == absl::InfiniteDuration()) {  // the parts before it have been absorbed
      st.update_start = t0 - op->start();
      st.inter_region_bytes_to_before_update = st.inter_region_bytes_to;
    }
    update(off, sum, main);
    in_update += absl::Now() - t0;
  };
  if (static_cast<int64_t>(grad.size()) != n_ || static_cast<int64_t>(weights.size()) != n_) {
    s = absl::InvalidArgumentError(
        absl::StrCat("a step over ", grad.size(), " gradients and ", weights.size(), " weights; ", n_, " expected"));
  } else if (o_.codec == DpCodec::kFp32) {
    s = StepFp32(*op, grad, weights, timed);
  } else if (IsBitDp(o_.codec)) {
    s = StepBitDp(*op, grad, weights, timed);
  } else {
    s = StepQuantised(*op, grad, weights, timed);
  }
  op->stats().update = in_update;
  ++steps_;
  return g_->Finish(*op, s);
}

void DataParallelSync::PadGradient(absl::Span<const float> grad) {
  padded_.resize(static_cast<size_t>(layout_.padded()));
  std::copy(grad.begin(), grad.end(), padded_.begin());
  std::fill(padded_.begin() + static_cast<std::ptrdiff_t>(grad.size()), padded_.end(), 0.0f);
}

absl::Status DataParallelSync::StepFp32(Op& op, absl::Span<const float> grad, absl::Span<float> weights,
                                        const UpdateFn& update) {
  const int me = g_->rank();
  const int64_t c = layout_.chunk, b = layout_.begin(me), len = layout_.length(me);
  PadGradient(grad);
  if (absl::Status s = RingReduceScatter(op, g_->topology(), layout_, padded_.data()); !s.ok()) return s;
  if (main_.empty()) main_.assign(weights.begin() + b, weights.begin() + b + len);
  update(b, absl::MakeConstSpan(padded_.data() + me * c, static_cast<size_t>(len)), absl::MakeSpan(main_));
  // The new weights travel in the same buffer: this rank's shard, then the ring fills the others.
  std::fill(padded_.begin() + me * c, padded_.begin() + (me + 1) * c, 0.0f);
  std::copy(main_.begin(), main_.end(), padded_.begin() + me * c);
  if (absl::Status s = RingAllGather(op, g_->topology(), layout_, padded_.data()); !s.ok()) return s;
  std::memcpy(weights.data(), padded_.data(), weights.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status DataParallelSync::StepQuantised(Op& op, absl::Span<const float> grad, absl::Span<float> weights,
                                             const UpdateFn& update) {
  const Topology& topo = g_->topology();
  const int me = g_->rank();
  const int64_t b = layout_.begin(me), len = layout_.length(me);
  const uint64_t seed = o_.seed * 0x9e3779b97f4a7c15ull + steps_;
  PadGradient(grad);
  shard_.resize(static_cast<size_t>(layout_.chunk));
  if (absl::Status s = TwoLevelReduceScatter(op, topo, layout_, padded_.data(), o_.grad, seed, shard_.data(),
                                             o_.buckets);
      !s.ok()) {
    return s;
  }
  if (main_.empty()) main_.assign(weights.begin() + b, weights.begin() + b + len);
  update(b, absl::MakeConstSpan(shard_.data(), static_cast<size_t>(len)), absl::MakeSpan(main_));
  return GatherWeights(op, weights, seed);
}

absl::Status DataParallelSync::GatherWeights(Op& op, absl::Span<float> weights, uint64_t seed) {
  // Weights: qWD sends the quantised difference main - model (the model keeps what earlier steps
  // could not express, so the error does not accumulate); qwZ the quantised main weights. Every
  // rank's shard is cut into the same number of pieces of whole groups, a bucket being every
  // rank's piece j (BucketedAllGather). Piece by piece the values are the whole shard's (the same
  // groups and draws) and so are the bytes.
  const int P = g_->size(), me = g_->rank();
  const bool qwd = o_.codec == DpCodec::kSdp4Bit;
  const int64_t g = o_.weights.group_size;
  const int K = BucketsFor(layout_.chunk, g, o_.buckets);
  // Piece j of shard k: elements [at(k, j), at(k, j + 1)) of it.
  auto at = [&](int k, int j) {
    const int64_t len = layout_.length(k), groups = (len + g - 1) / g;
    return std::min(len, groups * j / K * g);
  };
  BucketedBlobs bb;
  bb.expected.resize(static_cast<size_t>(K));
  bb.raw.resize(static_cast<size_t>(K));
  for (int j = 0; j < K; ++j) {
    for (int k = 0; k < P; ++k) {
      const int64_t m = at(k, j + 1) - at(k, j);
      bb.expected[j].push_back(static_cast<int64_t>(codec::SymQuantPayloadBytes(m, o_.weights)));
      bb.raw[j].push_back(m * 4);
    }
  }
  const int64_t b = layout_.begin(me);
  bb.encode = [&](int j, std::string* mine) {
    const int64_t from = at(me, j), m = at(me, j + 1) - from;
    if (qwd) {
      *mine = codec::QwdEncodeShard(main_.data() + from, weights.data() + b + from, m, o_.weights, from);
    } else {
      codec::SymQuantEncode(main_.data() + from, m, o_.weights, seed, mine, from);
    }
  };
  bb.use = [&](int j, const std::vector<std::string>& pieces) {
    // A bucket's pieces are all checked before any is applied (an earlier bucket's may already
    // have been: on an error the weights may be half updated, as Step says).
    for (int k = 0; k < P; ++k) {
      if (absl::Status s = codec::SymQuantValidate(pieces[k], at(k, j + 1) - at(k, j), o_.weights); !s.ok()) {
        return BadPayload(op, k, qwd ? "weight-difference payload" : "weight payload", s);
      }
    }
    for (int k = 0; k < P; ++k) {
      const int64_t from = at(k, j), m = at(k, j + 1) - from;
      if (m == 0) continue;
      const codec::SymDecodeOptions d{/*accumulate=*/qwd, /*hadamard_domain=*/false};
      codec::SymQuantDecode(pieces[k], m, o_.weights, d, weights.data() + layout_.begin(k) + from);
    }
    return absl::OkStatus();
  };
  bb.what = "its weights";
  return BucketedAllGather(op, g_->topology(), bb);
}

absl::Status DataParallelSync::StepBitDp(Op& op, absl::Span<const float> grad, absl::Span<float> weights,
                                         const UpdateFn& update) {
  const Topology& topo = g_->topology();
  const int P = topo.size(), bits = Bits(o_.codec);
  struct Rows {
    int64_t at, rows, cols;  // at: the first element's offset in the flat buffer
  };
  std::vector<float> plain;  // the segments BitDP leaves alone (embeddings, biases, norms)
  std::vector<Rows> quantised;
  int64_t payload = 0, quantised_elements = 0, quantised_rows = 0, off = 0;
  for (const BitDpSegment& s : o_.bitdp_layout) {
    const int64_t m = s.rows * s.cols;
    if (s.quantise) {
      quantised.push_back({off, s.rows, s.cols});
      payload += static_cast<int64_t>(codec::BitDpPayloadBytes(s.rows, s.cols, bits));
      quantised_elements += m;
      quantised_rows += s.rows;
    } else {
      plain.insert(plain.end(), grad.begin() + off, grad.begin() + off + m);
    }
    off += m;
  }
  // Row ranges of the quantised segments (rows are independent: one scale each) dealt in order to
  // up to `wanted` buckets of about equal payload: the next bucket opens once the current one holds
  // its share, so none is empty. Every rank cuts the same layout the same way.
  const int wanted = static_cast<int>(std::min<int64_t>(BucketsFor(quantised_elements, 1, o_.buckets),
                                                        std::max<int64_t>(quantised_rows, 1)));
  std::vector<std::vector<Rows>> buckets(1);
  BucketedBlobs bb;
  bb.expected.assign(1, std::vector<int64_t>(static_cast<size_t>(P), 0));
  bb.raw = bb.expected;
  int64_t done = 0;  // payload bytes dealt so far
  for (const Rows& q : quantised) {
    const int64_t row_bytes = static_cast<int64_t>(codec::BitDpPayloadBytes(1, q.cols, bits));
    for (int64_t r = 0; r < q.rows;) {
      auto share_end = [&] { return payload * static_cast<int64_t>(buckets.size()) / wanted; };
      if (static_cast<int>(buckets.size()) < wanted && done >= share_end()) {
        buckets.emplace_back();
        bb.expected.push_back(std::vector<int64_t>(static_cast<size_t>(P), 0));
        bb.raw.push_back(bb.expected.back());
      }
      const bool last = static_cast<int>(buckets.size()) == wanted;
      const int64_t n = last ? q.rows - r : std::clamp<int64_t>((share_end() - done) / row_bytes, 1, q.rows - r);
      buckets.back().push_back({q.at + r * q.cols, n, q.cols});
      for (int64_t& e : bb.expected.back()) e += n * row_bytes;
      for (int64_t& e : bb.raw.back()) e += n * q.cols * 4;
      done += n * row_bytes;
      r += n;
    }
  }
  // The exact reduction of the same bytes in rank order: the same sum on every rank.
  std::vector<float> sum(static_cast<size_t>(n_));
  bb.encode = [&](int j, std::string* mine) {
    for (const Rows& q : buckets[j]) codec::BitDpEncode(grad.data() + q.at, q.rows, q.cols, bits, mine);
  };
  bb.use = [&](int j, const std::vector<std::string>& blobs) {
    std::vector<absl::string_view> views(static_cast<size_t>(P));
    size_t poff = 0;
    for (const Rows& q : buckets[j]) {
      const size_t bytes = static_cast<size_t>(codec::BitDpPayloadBytes(q.rows, q.cols, bits));
      for (int k = 0; k < P; ++k) {
        views[k] = absl::string_view(blobs[k]).substr(poff, bytes);
        if (absl::Status v = codec::BitDpValidate(views[k], q.rows, q.cols, bits); !v.ok()) {
          return BadPayload(op, k, "BitDP gradient payload", v);
        }
      }
      codec::BitDpReduceValidated(views, q.rows, q.cols, bits, codec::BitDpReduction::kExact, sum.data() + q.at);
      poff += bytes;
    }
    return absl::OkStatus();
  };
  bb.what = "its bit planes";
  // The segments left alone go through the fp32 ring at the same time: it needs nothing from the
  // planes, and on a slow link its transfers (most of the bytes across regions in a small model)
  // would otherwise only start after theirs.
  if (!plain.empty()) {
    bb.beside = [&](Op& rop) {
      const ShardLayout l = MakeShards(static_cast<int64_t>(plain.size()), P, kPlainAlign);
      plain.resize(static_cast<size_t>(l.padded()), 0.0f);
      absl::Status s = RingReduceScatter(rop, topo, l, plain.data());
      return s.ok() ? RingAllGather(rop, topo, l, plain.data()) : s;
    };
    bb.beside_name = "its fp32 ring";
  }
  if (absl::Status s = BucketedAllGather(op, topo, bb); !s.ok()) return s;
  off = 0;
  int64_t plain_off = 0;
  for (const BitDpSegment& s : o_.bitdp_layout) {
    const int64_t m = s.rows * s.cols;
    if (!s.quantise) {
      std::copy(plain.begin() + plain_off, plain.begin() + plain_off + m, sum.begin() + off);
      plain_off += m;
    }
    off += m;
  }
  // Replicated optimizer: every rank updates the whole buffer from the same sum.
  update(0, absl::MakeConstSpan(sum), weights);
  return absl::OkStatus();
}

}  // namespace longhaul::collective
