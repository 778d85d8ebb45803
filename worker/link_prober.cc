#include "worker/link_prober.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "netem/tcp_probe.h"

namespace longhaul::worker {

absl::StatusOr<std::pair<std::string, int>> ResolveProbeAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad probe address \"", host_port, "\" (want HOST:PORT)"));
  }
  const std::string host = host_port.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::pair<std::string, int>(buf, port);
}

LinkProber::LinkProber(const ProbeSettings& s, Report report, std::function<bool()> busy)
    : s_(s), report_(std::move(report)), busy_(std::move(busy)) {
  tokens_ = static_cast<double>(s_.budget_bytes_per_hour);
  refilled_ = absl::Now();
  // Two workers' probers must not draw the same retry delays: seeded from the clock and this object.
  rng_.seed(static_cast<uint64_t>(absl::ToUnixNanos(refilled_)) ^ reinterpret_cast<uintptr_t>(this));
  thread_ = std::thread([this] { Loop(); });
}

LinkProber::~LinkProber() { Stop(); }

void LinkProber::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t LinkProber::bytes_sent() {
  absl::MutexLock l(&mu_);
  return sent_;
}

bool LinkProber::ProbingHost(const std::string& ipv4) {
  absl::MutexLock l(&mu_);
  return !probing_.empty() && probing_ == ipv4;
}

int64_t LinkProber::refusals() {
  absl::MutexLock l(&mu_);
  return refusals_;
}

void LinkProber::SetPeers(const std::vector<Peer>& peers) {
  absl::MutexLock l(&mu_);
  std::map<uint64_t, State> next;
  for (const Peer& p : peers) {
    auto it = peers_.find(p.id);
    State st;
    if (it != peers_.end() && it->second.peer.address == p.address) st = it->second;
    st.peer = p;
    next[p.id] = std::move(st);
  }
  peers_ = std::move(next);
  ++generation_;
}

void LinkProber::Loop() {
  const double rate = static_cast<double>(s_.budget_bytes_per_hour) / 3600;  // bytes per second
  const double cap = static_cast<double>(s_.budget_bytes_per_hour);
  for (;;) {
    Peer peer;
    int64_t bytes = 0;
    bool calibrating = false;
    {
      absl::MutexLock l(&mu_);
      for (;;) {
        if (stop_) return;
        const absl::Time now = absl::Now();
        tokens_ = std::min(cap, tokens_ + rate * absl::ToDoubleSeconds(now - refilled_));
        refilled_ = now;
        const State* next = nullptr;
        for (const auto& [id, st] : peers_) {
          if (next == nullptr || st.due < next->due) next = &st;
        }
        absl::Time wake = absl::InfiniteFuture();
        if (next != nullptr && next->due <= now && cap > 0) {
          const double want = next->mbit > 0 ? next->mbit * 1e6 / 8 * absl::ToDoubleSeconds(s_.target)
                                             : static_cast<double>(s_.min_probe_bytes);
          bytes = static_cast<int64_t>(std::clamp(want, static_cast<double>(s_.min_probe_bytes),
                                                  static_cast<double>(s_.max_probe_bytes)));
          bytes = std::min(bytes, static_cast<int64_t>(cap));
          if (tokens_ >= static_cast<double>(bytes)) {
            peer = next->peer;
            calibrating = next->mbit <= 0;
            break;
          }
          wake = now + absl::Seconds((static_cast<double>(bytes) - tokens_) / rate);
        } else if (next != nullptr && cap > 0) {
          wake = next->due;
        }
        const uint64_t gen = generation_;
        auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != gen; };
        mu_.AwaitWithDeadline(absl::Condition(&changed), std::min(wake, now + absl::Seconds(1)));
      }
    }
    if (busy_()) {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(1));
      continue;
    }
    v1::LinkReport r;
    r.set_to_worker_id(peer.id);
    double seconds = 0, mbit = 0;
    bool refused = false;
    absl::StatusOr<std::pair<std::string, int>> where = ResolveProbeAddress(peer.address);
    if (!where.ok()) {
      r.set_error(std::string(where.status().message()));
    } else {
      {
        absl::MutexLock l(&mu_);
        probing_ = where->first;  // from before the connection: the peer's sink may ask at once
      }
      mbit = ProbeOnce(where->first, where->second, bytes, &r, &seconds, &refused);
      absl::MutexLock l(&mu_);
      probing_.clear();
    }
    bool retry = false;
    {
      absl::MutexLock l(&mu_);
      auto it = peers_.find(peer.id);
      if (it != peers_.end() && it->second.peer.address == peer.address) {
        State& st = it->second;
        const absl::Time now = absl::Now();
        if (!refused) {
          st.refused_since = absl::InfiniteFuture();
        } else {
          st.refused_since = std::min(st.refused_since, now);
          // Most likely the peer is probing this worker: try again once it is done, after a delay
          // of our own (so that two workers refused by each other do not retry in step).
          retry = now - st.refused_since < s_.busy_patience;
        }
        if (retry) {
          ++refusals_;
          const double lo = absl::ToDoubleSeconds(s_.busy_retry_min);
          const double hi = std::max(lo, absl::ToDoubleSeconds(s_.busy_retry_max));
          st.due = now + absl::Seconds(std::uniform_real_distribution<double>(lo, hi)(rng_));
        } else if (mbit > 0) {
          st.mbit = mbit;
          st.failures = 0;
          // A first probe over in a fraction of the target measured mostly the connection's start:
          // a sized one follows at once. Later ones come after the interval and up to a tenth more
          // (two workers' schedules for the same pair drift apart).
          const bool again = calibrating && seconds < absl::ToDoubleSeconds(s_.target) / 4 && bytes < s_.max_probe_bytes;
          st.due = again ? now : now + s_.interval * (1 + 0.1 * std::uniform_real_distribution<double>(0, 1)(rng_));
        } else {
          ++st.failures;
          st.due = now + std::min(s_.interval, absl::Seconds(5) * (1 << std::min(st.failures, 8)));
        }
      }
      if (!refused && where.ok()) {  // a refused probe sent nothing beyond its header
        tokens_ -= static_cast<double>(bytes);
        sent_ += bytes;
      }
    }
    if (!retry) report_(peer, r);
  }
}

double LinkProber::ProbeOnce(const std::string& ipv4, int port, int64_t bytes, v1::LinkReport* r, double* seconds,
                             bool* refused) {
  netem::ProbeOptions o;
  o.bytes = bytes;
  o.pings = s_.pings;
  o.connect_patience = s_.connect_patience;
  absl::StatusOr<netem::LinkMeasurement> m = netem::ProbeLink(ipv4, port, o);
  // netem's ProbeLink: ResourceExhausted is the sink's refusal (its answer to the header).
  *refused = !m.ok() && m.status().code() == absl::StatusCode::kResourceExhausted;
  if (!m.ok() || m->mbit_per_s <= 0) {
    r->set_error(m.ok() ? "the probe took no time" : std::string(m.status().message()));
    return 0;
  }
  const double total = static_cast<double>(bytes) * 8 / (m->mbit_per_s * 1e6);
  const double rtt = absl::ToDoubleSeconds(m->rtt);
  // Never credit more than 10x the raw rate, whatever the RTT estimate says.
  const double transfer = std::max(total - rtt, total / 10);
  const double mbit = static_cast<double>(bytes) * 8 / transfer / 1e6;
  *seconds = total;
  r->set_rtt_ms(rtt * 1e3);
  r->set_mbit_per_s(mbit);
  r->set_bytes(bytes);
  return mbit;
}

}  // namespace longhaul::worker
