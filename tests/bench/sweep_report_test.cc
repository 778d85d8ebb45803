// The throughput sweep's report (bench/sweep_report.h): what its markdown and --json say of the
// cells and of how they were measured.
#include "bench/sweep_report.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace longhaul::bench {
namespace {

std::vector<SweepRun> TwoCells(bool gpipe) {
  SweepRun fp32{"fp32", "fp32", 300, 2546, 35139};
  fp32.link_bound = 2930;
  fp32.fraction = fp32.tokens_per_s / fp32.link_bound;
  SweepRun tq{"tahquant", "int8", 300, 12573, 49995};
  tq.link_bound = 14916;
  tq.fraction = tq.tokens_per_s / tq.link_bound;
  if (gpipe) {
    fp32.gpipe_link_bound = 2757;
    fp32.gpipe_fraction = fp32.tokens_per_s / fp32.gpipe_link_bound;
    tq.gpipe_link_bound = 14038;
    tq.gpipe_fraction = tq.tokens_per_s / tq.gpipe_link_bound;
  }
  return {fp32, tq};
}

TEST(SweepReport, SaysHowManyUnshapedJobsTheComputeBoundIsTheMedianOf) {
  ReportSettings s;
  s.unshaped_rounds = 3;
  const std::string md = SweepMarkdown(TwoCells(true), s);
  EXPECT_NE(md.find("Compute bound: the median of 3 unshaped jobs per codec."), std::string::npos) << md;
  s.unshaped_rounds = 1;
  EXPECT_NE(SweepMarkdown(TwoCells(true), s).find("the median of 1 unshaped job per codec."), std::string::npos);
  const nlohmann::ordered_json j = SweepJson(TwoCells(true), s);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["compute_bound_jobs"], 1);
  EXPECT_EQ(j["runs"][1]["compute_bound"], 49995.0);
}

TEST(SweepReport, GivesSpeedUpsAgainstFp32AndLeavesGPipeColumnsEmptyForOtherSchedules) {
  const ReportSettings s;
  const std::string md = SweepMarkdown(TwoCells(true), s);
  EXPECT_NE(md.find("| 300 | tahquant / int8 | 12573 | 49995 | 14916 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 4.94x |"), std::string::npos) << md;  // 12573 / 2546
  EXPECT_NE(md.find("| 14038 | 0.90 |"), std::string::npos) << md;
  nlohmann::ordered_json j = SweepJson(TwoCells(true), s);
  EXPECT_DOUBLE_EQ(j["runs"][1]["speedup_vs_fp32"].get<double>(), 4.938);
  EXPECT_DOUBLE_EQ(j["runs"][1]["fraction_of_gpipe_bound"].get<double>(), 0.896);
  j = SweepJson(TwoCells(false), s);
  EXPECT_TRUE(j["runs"][1]["fraction_of_gpipe_bound"].is_null());
  EXPECT_NE(SweepMarkdown(TwoCells(false), s).find("| 14916 | 0.00 | 0 | 0.84 | 0.00 | - | - | - |"),
            std::string::npos)
      << SweepMarkdown(TwoCells(false), s);
}

TEST(SweepReport, NamesThePaceOnlyForTcHosts) {
  ReportSettings s;
  s.pace = 0.98;
  EXPECT_EQ(SweepMarkdown(TwoCells(true), s).find("Senders paced"), std::string::npos);
  s.tc = true;
  EXPECT_NE(SweepMarkdown(TwoCells(true), s).find("Senders paced at 0.98 of the TCP payload"), std::string::npos);
  EXPECT_DOUBLE_EQ(SweepPaceMbit(false, 0.98, 300), 0.0);
  EXPECT_DOUBLE_EQ(SweepPaceMbit(true, 0.98, 0), 0.0);  // unshaped cells are not paced
  EXPECT_GT(SweepPaceMbit(true, 0.98, 300), 0.9 * 300 * 1448 / 1514);
  EXPECT_LT(SweepPaceMbit(true, 0.98, 300), 300.0);
}

}  // namespace
}  // namespace longhaul::bench
