#include "bench/link_timeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/read_file.h"

namespace longhaul::bench {

absl::StatusOr<DevBytes> ParseNetDev(absl::string_view text, absl::string_view dev) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || absl::StripAsciiWhitespace(line.substr(0, colon)) != dev) continue;
    const std::vector<absl::string_view> f =
        absl::StrSplit(line.substr(colon + 1), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    DevBytes b;
    // Fields 0..7 receive (bytes first), 8..15 transmit (bytes first).
    if (f.size() < 16 || !absl::SimpleAtoi(f[0], &b.rx) || !absl::SimpleAtoi(f[8], &b.tx)) {
      return absl::InvalidArgumentError(absl::StrCat("a malformed /proc/net/dev line for ", dev, ": '", line, "'"));
    }
    return b;
  }
  return absl::NotFoundError(absl::StrCat("no device ", dev, " in /proc/net/dev"));
}

IdleProfile ProfileIdle(const ByteSeries& s, absl::Time begin, absl::Time end, double rate_bytes_per_s,
                        double frame_s) {
  IdleProfile p;
  p.window_s = std::max(0.0, absl::ToDoubleSeconds(end - begin));
  if (rate_bytes_per_s <= 0 || frame_s <= 0) return p;
  double gap_s = 0;  // idle seconds of the gap being measured
  double gap_len_s = 0;  // its length
  auto close_gap = [&] {
    if (gap_len_s <= 0) return;
    if (gap_len_s < frame_s) {
      p.between_frames_s += gap_s;
    } else if (gap_len_s <= kTurnFrames * frame_s) {
      p.turns_s += gap_s;
      ++p.turns;
    } else {
      p.long_s += gap_s;
      ++p.long_gaps;
    }
    gap_s = gap_len_s = 0;
  };
  for (size_t i = 1; i < s.at.size() && i < s.bytes.size(); ++i) {
    const absl::Time a = std::max(s.at[i - 1], begin), b = std::min(s.at[i], end);
    const double whole = absl::ToDoubleSeconds(s.at[i] - s.at[i - 1]);
    const double dt = absl::ToDoubleSeconds(b - a);
    if (dt <= 0 || whole <= 0) continue;
    // The interval's part inside the window carries that share of its bytes.
    const double bytes = static_cast<double>(s.bytes[i] - s.bytes[i - 1]) * dt / whole;
    const double cap = rate_bytes_per_s * dt;
    const double busy = std::min(bytes, cap) / rate_bytes_per_s;
    p.busy_s += busy;
    if (bytes < cap / 2) {
      gap_s += dt - busy;
      gap_len_s += dt;
    } else {
      close_gap();
      p.between_frames_s += dt - busy;
    }
  }
  close_gap();
  return p;
}

LinkIdle BusiestLinkIdle(const LinkSampler& s, absl::Time begin, absl::Time end, double rate_bytes_per_s,
                         double frame_s) {
  LinkIdle best;
  double most = -1;
  for (size_t i = 0; i < s.hosts().size(); ++i) {
    for (const auto& [series, side] : {std::pair(&s.up()[i], "up"), std::pair(&s.down()[i], "down")}) {
      const IdleProfile p = ProfileIdle(*series, begin, end, rate_bytes_per_s, frame_s);
      if (p.busy_s > most) {
        most = p.busy_s;
        best = {absl::StrCat(s.hosts()[i].name, " ", side), p};
      }
    }
  }
  return best;
}

LinkSampler::LinkSampler(std::vector<Host> hosts, absl::Duration period)
    : hosts_(std::move(hosts)), period_(period), up_(hosts_.size()), down_(hosts_.size()) {}

namespace {
absl::StatusOr<DevBytes> ReadEth0(pid_t pid) {
  absl::StatusOr<std::string> text = common::ReadFile(absl::StrCat("/proc/", pid, "/net/dev"));
  if (!text.ok()) return text.status();
  return ParseNetDev(*text, "eth0");
}
}  // namespace

absl::StatusOr<std::unique_ptr<LinkSampler>> LinkSampler::Start(std::vector<Host> hosts, absl::Duration period) {
  for (const Host& h : hosts) {
    if (absl::StatusOr<DevBytes> b = ReadEth0(h.pid); !b.ok()) {
      return absl::Status(b.status().code(), absl::StrCat("host ", h.name, ": ", b.status().message()));
    }
  }
  std::unique_ptr<LinkSampler> s(new LinkSampler(std::move(hosts), period));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

LinkSampler::~LinkSampler() { Stop(); }

void LinkSampler::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void LinkSampler::Loop() {
  std::vector<bool> ended(hosts_.size(), false);
  absl::Time next = absl::Now();
  while (!stop_) {
    for (size_t i = 0; i < hosts_.size(); ++i) {
      if (ended[i]) continue;
      absl::StatusOr<DevBytes> b = ReadEth0(hosts_[i].pid);
      if (!b.ok()) {
        ended[i] = true;
        continue;
      }
      const absl::Time now = absl::Now();
      up_[i].at.push_back(now);
      up_[i].bytes.push_back(b->tx);
      down_[i].at.push_back(now);
      down_[i].bytes.push_back(b->rx);
    }
    // A late round is not made up for: the next one starts a period after this one's start, or now.
    next = std::max(next + period_, absl::Now());
    absl::SleepFor(next - absl::Now());
  }
}

}  // namespace longhaul::bench
