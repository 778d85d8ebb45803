// Failures inside a collective call: a dead rank makes every other rank's call fail within its
// deadline with an error naming the dead one (no hang), and a rank that sends malformed payloads
// makes its peers fail with an error naming it; a failed group refuses later calls.
#include <gtest/gtest.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collective/data_parallel.h"
#include "tests/collective/harness.h"

namespace longhaul::collective {
namespace {

using testing::Cluster;
using testing::Kind;

class FailureTest : public ::testing::TestWithParam<Kind> {};

TEST_P(FailureTest, ADeadRankFailsTheOthersWithinTheDeadlineNamingIt) {
  testing::ClusterOptions o;
  o.timeout = absl::Seconds(2);
  for (DpCodec codec : {DpCodec::kFp32, DpCodec::kSdp4Bit, DpCodec::kBitDp2}) {
    Cluster c(GetParam(), {"a", "a", "b", "b"}, o);
    c.Kill(2);
    std::vector<absl::Status> status(4);
    std::vector<absl::Duration> took(4);
    DpOptions opts = DefaultDpOptions(codec);
    // BitDP: bit planes and an fp32 segment, whose ring runs on a thread of its own.
    if (codec == DpCodec::kBitDp2) opts.bitdp_layout = {{40, 100, true}, {1, 1000, false}};
    c.Run([&](int r) {
      auto dp = DataParallelSync::Create(&c.group(r), 5000, opts);
      std::vector<float> g(5000, 1.0f), w(5000, 0.0f);
      const absl::Time t0 = absl::Now();
      auto none = [](int64_t, absl::Span<const float>, absl::Span<float>) {};
      status[r] = (*dp)->Step(g, absl::MakeSpan(w), none).status();
      took[r] = absl::Now() - t0;
    });
    for (int r : {0, 1, 3}) {
      EXPECT_FALSE(status[r].ok()) << "rank " << r;
      EXPECT_TRUE(absl::StrContains(status[r].message(), "rank 2")) << "rank " << r << ": " << status[r];
      // The deadline, one ping round and one abort notice at most.
      EXPECT_LT(took[r], absl::Seconds(5)) << "rank " << r << ": " << status[r];
    }
    std::printf("%s, rank 1: %s\n", DpCodecName(codec), status[1].ToString().c_str());
    // The group stays failed.
    absl::StatusOr<CallStats> again = c.group(0).AllReduceFp32(absl::MakeSpan(std::vector<float>(10).data(), 10));
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  }
}

// Forwards to a real transport, but damages what it sends: flips every byte (invalid scales and
// codes in every codec), or drops the last byte.
class DamagingTransport final : public Transport {
 public:
  enum class Damage { kFlip, kTruncate };
  DamagingTransport(Transport* t, Damage d) : t_(t), d_(d) {}
  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  std::string PeerName(int peer) const override { return t_->PeerName(peer); }
  absl::Status Send(int peer, uint64_t tag, absl::string_view data, absl::Time deadline) override {
    std::string bad(data);
    if (d_ == Damage::kFlip) {
      for (char& ch : bad) ch = static_cast<char>(0xff);
    } else if (!bad.empty()) {
      bad.pop_back();
    }
    return t_->Send(peer, tag, bad, deadline);
  }
  absl::StatusOr<std::string> Recv(int peer, uint64_t tag, absl::Time deadline) override {
    return t_->Recv(peer, tag, deadline);
  }
  void Abort(const absl::Status& why) override { t_->Abort(why); }
  std::vector<std::string> UnreachablePeers(absl::Time deadline) override { return t_->UnreachablePeers(deadline); }
  TransportCounters counters() const override { return t_->counters(); }

 private:
  Transport* t_;
  Damage d_;
};

TEST_P(FailureTest, MalformedPayloadsAreRefusedNamingTheSender) {
  // 3,000 elements: every collective in one piece; 131,072: in buckets (DpOptions::buckets), the
  // parts on threads of their own, BitDP's planes a 256 x 512 matrix's row ranges.
  auto check = [&](int64_t n, DpCodec codec, DamagingTransport::Damage damage) {
    Cluster c(GetParam(), {"a", "b"});
    DamagingTransport bad(&c.transport(1), damage);
    Group bad_group(&bad, c.group(1).topology());
    std::vector<absl::Status> status(2);
    c.Run([&](int r) {
      Group& g = r == 1 ? bad_group : c.group(r);
      DpOptions o = DefaultDpOptions(codec);
      if (n > 3000) o.bitdp_layout = {{256, 512, true}};
      auto dp = DataParallelSync::Create(&g, n, o);
      std::vector<float> grad(static_cast<size_t>(n), 0.5f + static_cast<float>(r)), w(static_cast<size_t>(n), 0.0f);
      status[r] = (*dp)->Step(grad, absl::MakeSpan(w), [](int64_t, absl::Span<const float>, absl::Span<float>) {})
                      .status();
    });
    SCOPED_TRACE(absl::StrCat(DpCodecName(codec), damage == DamagingTransport::Damage::kFlip ? " flip" : " cut", ", ",
                              n, " elements"));
    EXPECT_FALSE(status[0].ok());
    EXPECT_TRUE(absl::StrContains(status[0].message(), "rank 1")) << status[0];
    EXPECT_TRUE(absl::StrContains(status[0].message(), "sent")) << status[0];
    // The bad rank may finish its own step (what it received was fine), but rank 0's abort has
    // reached it: its next call fails.
    if (status[1].ok()) {
      std::vector<float> x(10);
      status[1] = bad_group.AllReduceFp32(absl::MakeSpan(x)).status();
    }
    EXPECT_FALSE(status[1].ok());
  };
  for (int64_t n : {int64_t{3000}, int64_t{131072}}) {
    for (DpCodec codec : {DpCodec::kSdp4Bit, DpCodec::kZeroPP, DpCodec::kBitDp2, DpCodec::kFp32}) {
      for (auto damage : {DamagingTransport::Damage::kFlip, DamagingTransport::Damage::kTruncate}) {
        if (codec == DpCodec::kFp32 && damage == DamagingTransport::Damage::kFlip) continue;  // any bits are a float
        check(n, codec, damage);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Both, FailureTest, ::testing::Values(Kind::kInProcess, Kind::kGrpc),
                         [](const ::testing::TestParamInfo<Kind>& i) { return testing::KindName(i.param); });

}  // namespace
}  // namespace longhaul::collective
