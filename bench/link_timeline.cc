#include "bench/link_timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
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
                        double frame_s, double turn_frames) {
  IdleProfile p;
  p.window_s = std::max(0.0, absl::ToDoubleSeconds(end - begin));
  if (rate_bytes_per_s <= 0 || frame_s <= 0) return p;
  bool in_gap = false;
  absl::Time gap_start, gap_end;  // the open gap's whole extent
  double gap_idle_s = 0;          // its idle seconds inside the window
  auto close_gap = [&] {
    if (!in_gap) return;
    const double gap_len_s = absl::ToDoubleSeconds(gap_end - gap_start);
    if (gap_len_s < frame_s) {
      p.between_frames_s += gap_idle_s;
    } else if (gap_len_s <= turn_frames * frame_s) {
      p.turns_s += gap_idle_s;
      if (gap_idle_s > 0) ++p.turns;
    } else {
      p.long_s += gap_idle_s;
      if (gap_idle_s > 0) ++p.long_gaps;
    }
    in_gap = false;
    gap_idle_s = 0;
  };
  double carry = 0;  // bytes beyond the rate in earlier intervals
  for (size_t i = 1; i < s.at.size() && i < s.bytes.size(); ++i) {
    const double whole = absl::ToDoubleSeconds(s.at[i] - s.at[i - 1]);
    if (whole <= 0) continue;
    const double offered = static_cast<double>(s.bytes[i] - s.bytes[i - 1]) + carry;
    const double sent = std::min(offered, rate_bytes_per_s * whole);
    carry = offered - sent;
    // The interval's part inside the window, and that share of its bytes.
    const double dt = std::max(0.0, absl::ToDoubleSeconds(std::min(s.at[i], end) - std::max(s.at[i - 1], begin)));
    const double busy = sent / rate_bytes_per_s * dt / whole;
    p.busy_s += busy;
    if (sent < rate_bytes_per_s * whole / 2) {
      if (!in_gap) gap_start = s.at[i - 1];
      in_gap = true;
      gap_end = s.at[i];
      gap_idle_s += dt - busy;
    } else {
      close_gap();
      p.between_frames_s += dt - busy;
    }
  }
  close_gap();
  return p;
}

IdleShares SharesOf(const LinkIdle& li, int64_t steps) {
  const double w = std::max(li.idle.window_s, 1e-9), n = static_cast<double>(std::max<int64_t>(steps, 1));
  return {li.link,         li.idle.busy_s / w, li.idle.between_frames_s / w, li.idle.turns_s / w,
          li.idle.long_s / w, li.idle.turns / n, li.idle.long_gaps / n};
}

LinkIdle BusiestLinkIdle(const std::vector<std::string>& names, const std::vector<ByteSeries>& up,
                         const std::vector<ByteSeries>& down, absl::Time begin, absl::Time end,
                         double rate_bytes_per_s, double frame_s, double turn_frames) {
  LinkIdle best;
  double most = -1;
  for (size_t i = 0; i < names.size() && i < up.size() && i < down.size(); ++i) {
    for (const auto& [series, side] : {std::pair(&up[i], "up"), std::pair(&down[i], "down")}) {
      const IdleProfile p = ProfileIdle(*series, begin, end, rate_bytes_per_s, frame_s, turn_frames);
      if (p.busy_s > most) {
        most = p.busy_s;
        best = {absl::StrCat(names[i], " ", side), p};
      }
    }
  }
  return best;
}

namespace {

std::vector<std::string> Names(const std::vector<LinkSampler::Host>& hosts) {
  std::vector<std::string> names;
  for (const LinkSampler::Host& h : hosts) names.push_back(h.name);
  return names;
}

absl::StatusOr<DevBytes> ReadCounters(const LinkSampler::Host& h) {
  absl::StatusOr<std::string> text = common::ReadFile(absl::StrCat("/proc/", h.pid, "/net/dev"));
  if (!text.ok()) return text.status();
  return ParseNetDev(*text, h.dev);
}

}  // namespace

LinkSampler::LinkSampler(std::vector<Host> hosts, absl::Duration period)
    : hosts_(std::move(hosts)), names_(Names(hosts_)), period_(period), up_(hosts_.size()), down_(hosts_.size()) {}

absl::StatusOr<std::unique_ptr<LinkSampler>> LinkSampler::Start(std::vector<Host> hosts, absl::Duration period) {
  for (const Host& h : hosts) {
    if (absl::StatusOr<DevBytes> b = ReadCounters(h); !b.ok()) {
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
      // The sample's time: the middle of its read.
      const absl::Time t0 = absl::Now();
      absl::StatusOr<DevBytes> b = ReadCounters(hosts_[i]);
      if (!b.ok()) {
        ended[i] = true;
        continue;
      }
      const absl::Time now = t0 + (absl::Now() - t0) / 2;
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

StepWindow WindowOf(const std::vector<StepEnd>& ends, bool still_running) {
  StepWindow w;
  if (ends.size() < 2 || !still_running) return w;
  w.begin = ends.front().seen;
  w.end = ends.back().seen;
  w.steps = ends.back().step - ends.front().step;
  return w;
}

absl::Status AppendLinkTrace(const std::string& path, const std::string& cell, int64_t round,
                             const std::vector<std::string>& names, const std::vector<ByteSeries>& up,
                             const std::vector<ByteSeries>& down, const std::vector<StepEnd>& ends) {
  auto failed = [&path](const char* what, int err) {
    return absl::InternalError(absl::StrCat("cannot ", what, " the link trace ", path, ": ", std::strerror(err)));
  };
  const bool fresh = access(path.c_str(), F_OK) != 0;
  FILE* out = std::fopen(path.c_str(), "a");
  if (out == nullptr) return failed("open", errno);
  auto secs = [](absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); };
  if (fresh) absl::FPrintF(out, "cell,round,kind,host,step,unix_s,up_bytes,down_bytes\n");
  for (const StepEnd& e : ends) absl::FPrintF(out, "%s,%d,step,,%d,%.6f,,\n", cell, round, e.step, secs(e.seen));
  for (size_t h = 0; h < names.size() && h < up.size() && h < down.size(); ++h) {
    for (size_t i = 0; i < up[h].at.size() && i < down[h].bytes.size(); ++i) {
      absl::FPrintF(out, "%s,%d,link,%s,,%.6f,%d,%d\n", cell, round, names[h], secs(up[h].at[i]), up[h].bytes[i],
                    down[h].bytes[i]);
    }
  }
  // The first failure's errno (a failed print leaves the stream's error flag; EIO if it left no errno).
  int err = 0;
  if (std::fflush(out) != 0 || std::ferror(out) != 0) err = errno != 0 ? errno : EIO;
  if (std::fclose(out) != 0 && err == 0) err = errno;
  if (err != 0) return failed("write", err);
  return absl::OkStatus();
}

}  // namespace longhaul::bench
