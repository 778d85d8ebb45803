#include "netem/tc/network.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include <boost/filesystem/path.hpp>
#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>
#include <boost/process/search_path.hpp>
#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "netem/shaper.h"
#include "netem/tcp_probe.h"

namespace longhaul::netem {

namespace {

namespace bp = boost::process;

// The tbf arguments for `mbit`: burst at least one MTU (plus slack) and ~1 ms of traffic; the
// latency bounds the queue (`queue_ms` of traffic at the rate).
std::vector<std::string> TbfArgs(double mbit, double queue_ms) {
  const int64_t burst = DefaultBurstBytes(MbitToBytesPerSecond(mbit));
  return {"tbf", "rate", absl::StrCat(mbit, "mbit"), "burst", absl::StrCat(burst), "latency", absl::StrCat(queue_ms, "ms")};
}

// A byte FIFO that holds `queue_ms` of traffic at `mbit` (what tbf's latency bounds), at least
// two full-size packets.
std::string FifoLimit(double mbit, double queue_ms) {
  return absl::StrCat(std::max<int64_t>(3200, static_cast<int64_t>(MbitToBytesPerSecond(mbit) * queue_ms / 1e3)));
}

// htb's quantum (bytes a class sends per round) from its rate, within what htb accepts quietly.
std::string HtbQuantum(double mbit) {
  return absl::StrCat(std::clamp<int64_t>(static_cast<int64_t>(MbitToBytesPerSecond(mbit) / 10), 1600, 60000));
}

// The egress of host `h` in a topology with regions: an htb whose class 1:1 holds the host's
// rate (unlimited hosts: the most a rate may be); under it the default class 1:10 (hosts of its
// own region, hosts without one) and, per host of another region, a class at the rate between
// regions that a u32 filter on the destination address sends it to (1:1xx, xx the host's index in
// hex). One class per destination, so that each pair has its rate: a worker's activations to one
// host and gradients to another do not share one.
std::vector<std::vector<std::string>> RegionEgress(const Topology& t, const HostSpec& h, const std::string& ns,
                                                   const std::string& dev) {
  const double own = h.rate_mbit > 0 ? h.rate_mbit : 100000;
  const double between = std::min(own, t.between_regions_mbit);
  auto htb_class = [&](const std::string& parent, const std::string& id, double mbit) {
    return std::vector<std::string>{"tc", "-n", ns, "class", "add", "dev", dev, "parent", parent, "classid", id, "htb",
                                    "rate", absl::StrCat(mbit, "mbit"), "quantum", HtbQuantum(mbit)};
  };
  std::vector<std::vector<std::string>> c = {
      {"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"},
      htb_class("1:", "1:1", own),
      htb_class("1:1", "1:10", own),
  };
  if (h.rate_mbit > 0) {
    c.push_back({"tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "bfifo", "limit",
                 FifoLimit(h.rate_mbit, h.queue_ms)});
  }
  for (size_t i = 0; i < t.hosts.size(); ++i) {
    const HostSpec& other = t.hosts[i];
    if (other.region.empty() || other.region == h.region) continue;
    const std::string minor = absl::StrCat(absl::Hex(0x100 + i));
    c.push_back(htb_class("1:1", absl::StrCat("1:", minor), between));
    c.push_back({"tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", absl::StrCat("1:", minor), "handle",
                 absl::StrCat(minor, ":"), "bfifo", "limit", FifoLimit(between, t.between_regions_queue_ms)});
    c.push_back({"tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                 "match", "ip", "dst", absl::StrCat(t.Address(other.name), "/32"), "flowid", absl::StrCat("1:", minor)});
  }
  return c;
}

bool RegionShaped(const Topology& t, const HostSpec& h) { return t.between_regions_mbit > 0 && !h.region.empty(); }

// Where a host's access link is shaped, as (namespace, device): [0] the host's own eth0 (its
// upload), [1] the bridge port towards it in the switch namespace (its download).
struct Egress {
  std::string ns, dev;
};
std::array<Egress, 2> AccessLinkEgress(const Topology& t, const std::string& host) {
  return {Egress{t.Namespace(host), "eth0"}, Egress{t.SwitchNamespace(), absl::StrCat(t.name, "-", host, "-s")}};
}

}  // namespace

std::string Topology::Address(const std::string& host) const {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i].name == host) return absl::StrCat(subnet, ".", i + 2);
  }
  return "";
}

absl::Status CheckCongestion(const std::string& name) {
  bool ok = !name.empty() && name.size() < 16;  // TCP_CA_NAME_MAX, its NUL included
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" must be an algorithm's name (cubic, reno, bbr: ",
                                                 "/proc/sys/net/ipv4/tcp_available_congestion_control) or ",
                                                 kMachineCongestion));
}

absl::StatusOr<Topology> ParseTopology(const std::string& yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat("topology is not valid YAML: line ", e.mark.line + 1, ": ", e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("topology must be a YAML mapping");
  Topology t;
  std::vector<std::string> p;
  auto is_name = [](const std::string& s, size_t max) {
    if (s.empty() || s.size() > max) return false;
    for (char c : s) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
    }
    return true;
  };
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>("");
    if (k != "name" && k != "subnet" && k != "tcp_congestion" && k != "hosts" && k != "between_regions") {
      p.push_back(absl::StrCat(k, ": unknown key (name, subnet, tcp_congestion, hosts, between_regions)"));
    }
  }
  if (const YAML::Node b = root["between_regions"]) {
    if (!b.IsMap()) {
      p.push_back("between_regions: must be a mapping {rate_mbit, queue_ms}");
    } else {
      try {
        for (const auto& kv : b) {
          const std::string k = kv.first.as<std::string>("");
          if (k == "rate_mbit") t.between_regions_mbit = kv.second.as<double>();
          else if (k == "queue_ms") t.between_regions_queue_ms = kv.second.as<double>();
          else p.push_back(absl::StrCat("between_regions.", k, ": unknown key (rate_mbit, queue_ms)"));
        }
      } catch (const YAML::Exception&) {
        p.push_back("between_regions: values must be numbers");
      }
      if (!(t.between_regions_mbit > 0 && t.between_regions_mbit <= 100000)) {
        p.push_back("between_regions.rate_mbit: out of (0, 100000]");
      }
      if (!(t.between_regions_queue_ms >= 1 && t.between_regions_queue_ms <= 60000)) {
        p.push_back("between_regions.queue_ms: out of [1, 60000]");
      }
    }
  }
  try {
    if (root["name"]) t.name = root["name"].as<std::string>();
    if (root["subnet"]) t.subnet = root["subnet"].as<std::string>();
    if (root["tcp_congestion"]) t.tcp_congestion = root["tcp_congestion"].as<std::string>();
  } catch (const YAML::Exception&) {
    p.push_back("name/subnet/tcp_congestion: must be strings");
  }
  if (!is_name(t.name, 6)) p.push_back(absl::StrCat("name: \"", t.name, "\" must be 1..6 letters, digits or _"));
  if (absl::Status s = CheckCongestion(t.tcp_congestion); !s.ok()) p.push_back(absl::StrCat("tcp_congestion: ", s.message()));
  std::vector<std::string> octets = absl::StrSplit(t.subnet, '.');
  bool subnet_ok = octets.size() == 3;
  for (const std::string& o : octets) {
    int v;
    subnet_ok = subnet_ok && absl::SimpleAtoi(o, &v) && v >= 0 && v <= 255;
  }
  if (!subnet_ok) p.push_back(absl::StrCat("subnet: \"", t.subnet, "\" must be the first three octets of a /24, e.g. 10.77.0"));
  const bool between_regions = static_cast<bool>(root["between_regions"]);
  const YAML::Node hosts = root["hosts"];
  if (!hosts || !hosts.IsSequence() || hosts.size() == 0) {
    p.push_back("hosts: must be a non-empty list");
  } else {
    std::set<std::string> seen;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const YAML::Node h = hosts[i];
      HostSpec hs;
      const std::string where = absl::StrCat("hosts[", i, "]");
      if (!h.IsMap()) {
        p.push_back(absl::StrCat(where, ": must be a mapping"));
        continue;
      }
      try {
        for (const auto& kv : h) {
          const std::string k = kv.first.as<std::string>("");
          if (k == "name") hs.name = kv.second.as<std::string>();
          else if (k == "rate_mbit") hs.rate_mbit = kv.second.as<double>();
          else if (k == "delay_ms") hs.delay_ms = kv.second.as<double>();
          else if (k == "jitter_ms") hs.jitter_ms = kv.second.as<double>();
          else if (k == "loss") hs.loss = kv.second.as<double>();
          else if (k == "queue_ms") hs.queue_ms = kv.second.as<double>();
          else if (k == "region") hs.region = kv.second.as<std::string>();
          else p.push_back(absl::StrCat(where, ".", k, ": unknown key (name, region, rate_mbit, delay_ms, jitter_ms, loss, queue_ms)"));
        }
      } catch (const YAML::Exception&) {
        p.push_back(absl::StrCat(where, ": values must be a name and numbers"));
        continue;
      }
      // Interface names are <name>-<host>-h: at most 15 characters.
      if (!is_name(hs.name, 6)) p.push_back(absl::StrCat(where, ".name: \"", hs.name, "\" must be 1..6 letters, digits or _"));
      if (hs.name == "sw") p.push_back(absl::StrCat(where, ".name: \"sw\" is reserved for the switch"));
      if (!seen.insert(hs.name).second) p.push_back(absl::StrCat(where, ".name: \"", hs.name, "\" is repeated"));
      if (!(hs.rate_mbit >= 0 && hs.rate_mbit <= 100000)) p.push_back(absl::StrCat(where, ".rate_mbit: out of [0, 100000]"));
      if (!(hs.delay_ms >= 0 && hs.delay_ms <= 60000)) p.push_back(absl::StrCat(where, ".delay_ms: out of [0, 60000]"));
      if (!(hs.jitter_ms >= 0 && hs.jitter_ms <= hs.delay_ms)) p.push_back(absl::StrCat(where, ".jitter_ms: must be in [0, delay_ms]"));
      if (!(hs.loss >= 0 && hs.loss <= 0.5)) p.push_back(absl::StrCat(where, ".loss: out of [0, 0.5]"));
      if (!(hs.queue_ms >= 1 && hs.queue_ms <= 60000)) p.push_back(absl::StrCat(where, ".queue_ms: out of [1, 60000]"));
      if (!hs.region.empty() && !is_name(hs.region, 32)) {
        p.push_back(absl::StrCat(where, ".region: \"", hs.region, "\" must be 1..32 letters, digits or _"));
      }
      if (!hs.region.empty() && between_regions && (hs.delay_ms > 0 || hs.jitter_ms > 0 || hs.loss > 0)) {
        p.push_back(absl::StrCat(where, ": delay_ms, jitter_ms and loss are not supported on a host of a region "
                                        "(give them to the job spec's links: section)"));
      }
      t.hosts.push_back(hs);
    }
    if (hosts.size() > 250) p.push_back("hosts: at most 250 in a /24");
  }
  if (!p.empty()) return absl::InvalidArgumentError(absl::StrJoin(p, "\n"));
  return t;
}

namespace {

constexpr size_t kMaxStdout = 1 << 20;  // tc -s of one qdisc is a few hundred bytes
constexpr size_t kMaxStderr = 64 << 10;  // an error message

// Reads `in` to its end, keeping the first `cap` bytes; the rest is read and dropped, so the child
// never blocks on a full pipe.
std::string Drain(bp::ipstream& in, size_t cap) {
  std::string kept;
  char buf[4096];
  for (;;) {
    in.read(buf, sizeof(buf));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) return kept;
    kept.append(buf, std::min(n, cap - std::min(cap, kept.size())));
  }
}

// Runs argv (argv[0] looked up in PATH) with stderr captured for the error message and stdout
// captured into *out, or discarded when out is null. Both pipes are read at the same time (stderr
// on a second thread), so a child that fills one while we wait on the other cannot deadlock.
absl::Status Spawn(const std::vector<std::string>& argv, std::string* out) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  const boost::filesystem::path exe =
      argv[0].find('/') == std::string::npos ? bp::search_path(argv[0]) : boost::filesystem::path(argv[0]);
  if (exe.empty()) return absl::NotFoundError(absl::StrCat("cannot run ", argv[0], ": not found in PATH"));
  const std::vector<std::string> args(argv.begin() + 1, argv.end());
  bp::ipstream out_pipe, err_pipe;
  std::error_code ec;
  bp::child child = out != nullptr ? bp::child(exe, bp::args(args), bp::std_out > out_pipe, bp::std_err > err_pipe, ec)
                                   : bp::child(exe, bp::args(args), bp::std_out > bp::null, bp::std_err > err_pipe, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot run ", argv[0], ": ", ec.message()));
  std::string msg;
  std::thread err_reader([&] { msg = Drain(err_pipe, kMaxStderr); });
  if (out != nullptr) *out = Drain(out_pipe, kMaxStdout);
  err_reader.join();
  child.wait(ec);
  if (!ec && child.exit_code() == 0) return absl::OkStatus();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  if (ec) msg = absl::StrCat("cannot wait for it: ", ec.message());
  return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "), "` failed: ", msg));
}

}  // namespace

absl::Status RunCommand(const std::vector<std::string>& argv) { return Spawn(argv, nullptr); }

absl::StatusOr<std::string> RunCommandOutput(const std::vector<std::string>& argv) {
  std::string out;
  if (absl::Status s = Spawn(argv, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<QdiscCounters> ParseQdiscCounters(const std::string& tc_s_output) {
  // "qdisc tbf 8001: dev eth0 root ...\n Sent 1391436 bytes 2225 pkt (dropped 101, overlimits ..."
  const size_t at = tc_s_output.find("Sent ");
  QdiscCounters c;
  long long bytes = 0, packets = 0, drops = 0;
  if (at == std::string::npos ||
      std::sscanf(tc_s_output.c_str() + at, "Sent %lld bytes %lld pkt (dropped %lld", &bytes, &packets, &drops) != 3) {
    return absl::InvalidArgumentError(absl::StrCat("no \"Sent N bytes M pkt (dropped D\" in tc's output: ",
                                                   tc_s_output.substr(0, 200)));
  }
  c.bytes = bytes, c.packets = packets, c.drops = drops;
  return c;
}

bool Network::NetemAvailable() {
  const std::string ns = t_.name + "-probe";
  (void)run_({"ip", "netns", "del", ns});
  if (!run_({"ip", "netns", "add", ns}).ok()) return false;
  const bool ok = run_({"ip", "-n", ns, "link", "set", "lo", "up"}).ok() &&
                  run_({"tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"}).ok();
  (void)run_({"ip", "netns", "del", ns});
  return ok;
}

absl::Status Network::Up(const std::function<bool()>& interrupted) {
  notes_.clear();
  if (absl::Status s = CheckCongestion(t_.tcp_congestion); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tcp_congestion: ", s.message()));
  }
  // Never adopt (and later delete) namespaces this topology did not create.
  std::vector<std::string> all = {t_.SwitchNamespace()};
  for (const HostSpec& h : t_.hosts) all.push_back(t_.Namespace(h.name));
  for (const std::string& ns : all) {
    if (std::filesystem::exists("/run/netns/" + ns)) {
      return absl::AlreadyExistsError(absl::StrCat("network namespace ", ns, " already exists (is \"", t_.name,
                                                   "\" up already? `longhaul-netem down` it first)"));
    }
  }
  const bool want_netem = [&] {
    for (const HostSpec& h : t_.hosts) {
      if (h.delay_ms > 0 || h.jitter_ms > 0 || h.loss > 0) return true;
    }
    return false;
  }();
  const bool netem = want_netem && NetemAvailable();
  if (want_netem && !netem) {
    notes_.push_back(
        "tc netem is not available in this kernel: delay, jitter and loss are NOT applied by tc; set them in "
        "the job spec's links: section (in-process shaper) instead. Rates are applied with tbf.");
  }
  const std::string sw = t_.SwitchNamespace();
  std::vector<std::vector<std::string>> cmds = {
      {"ip", "netns", "add", sw},
      {"ip", "-n", sw, "link", "add", "br0", "type", "bridge"},
      {"ip", "-n", sw, "link", "set", "br0", "up"},
      // Uplink from the root namespace (deleted with the switch namespace: veths die in pairs).
      {"ip", "link", "add", t_.name + "-up", "type", "veth", "peer", "name", t_.name + "-ups"},
      {"ip", "link", "set", t_.name + "-ups", "netns", sw},
      {"ip", "-n", sw, "link", "set", t_.name + "-ups", "master", "br0"},
      {"ip", "-n", sw, "link", "set", t_.name + "-ups", "up"},
      {"ip", "addr", "add", absl::StrCat(t_.subnet, ".1/24"), "dev", t_.name + "-up"},
      {"ip", "link", "set", t_.name + "-up", "up"},
  };
  for (const HostSpec& h : t_.hosts) {
    const std::string ns = t_.Namespace(h.name);
    const std::string hv = absl::StrCat(t_.name, "-", h.name, "-h"), sv = absl::StrCat(t_.name, "-", h.name, "-s");
    std::vector<std::vector<std::string>> c = {
        {"ip", "netns", "add", ns},
        {"ip", "link", "add", hv, "type", "veth", "peer", "name", sv},
        {"ip", "link", "set", hv, "netns", ns},
        {"ip", "link", "set", sv, "netns", sw},
        {"ip", "-n", ns, "link", "set", hv, "name", "eth0"},
        {"ip", "-n", ns, "addr", "add", absl::StrCat(t_.Address(h.name), "/24"), "dev", "eth0"},
        {"ip", "-n", ns, "link", "set", "eth0", "up"},
        {"ip", "-n", ns, "link", "set", "lo", "up"},
        {"ip", "-n", sw, "link", "set", sv, "master", "br0"},
        {"ip", "-n", sw, "link", "set", sv, "up"},
    };
    if (t_.tcp_congestion != kMachineCongestion) {
      // On the route every connection of the host takes (the subnet's), not by the namespace's
      // sysctl, which a container may refuse to write; fails naming the algorithm where the kernel
      // lacks it.
      c.push_back({"ip", "-n", ns, "route", "replace", absl::StrCat(t_.subnet, ".0/24"), "dev", "eth0", "proto",
                   "kernel", "scope", "link", "src", t_.Address(h.name), "congctl", t_.tcp_congestion});
    }
    cmds.insert(cmds.end(), c.begin(), c.end());
    const std::array<Egress, 2> egress = AccessLinkEgress(t_, h.name);
    for (const auto& [tns, dev] : egress) {
      if (RegionShaped(t_, h) && tns == egress[0].ns) {
        const std::vector<std::vector<std::string>> r = RegionEgress(t_, h, tns, dev);
        cmds.insert(cmds.end(), r.begin(), r.end());
        continue;
      }
      std::string parent = "root";
      if (netem && (h.delay_ms > 0 || h.jitter_ms > 0 || h.loss > 0)) {
        std::vector<std::string> n = {"tc", "-n", tns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"};
        // Each direction crosses exactly one of the two qdiscs (host egress, bridge-port egress),
        // so each gets the full one-way delay.
        if (h.delay_ms > 0) {
          n.insert(n.end(), {"delay", absl::StrCat(h.delay_ms, "ms")});
          if (h.jitter_ms > 0) n.push_back(absl::StrCat(h.jitter_ms, "ms"));
        }
        if (h.loss > 0) n.insert(n.end(), {"loss", absl::StrCat(h.loss * 100, "%")});
        cmds.push_back(n);
        parent = "parent 1:";
      }
      if (h.rate_mbit > 0) {
        std::vector<std::string> r = {"tc", "-n", tns, "qdisc", "add", "dev", dev};
        if (parent == "root") {
          r.push_back("root");
        } else {
          r.insert(r.end(), {"parent", "1:", "handle", "2:"});
        }
        const std::vector<std::string> tbf = TbfArgs(h.rate_mbit, h.queue_ms);
        r.insert(r.end(), tbf.begin(), tbf.end());
        cmds.push_back(r);
      }
    }
  }
  for (const auto& c : cmds) {
    absl::Status s = interrupted() ? absl::CancelledError("interrupted") : run_(c);
    if (!s.ok()) {
      (void)Down();
      return absl::Status(s.code(), absl::StrCat(s.message(), " (everything built so far was removed)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Network::SetRate(double mbit) {
  if (t_.between_regions_mbit > 0) {
    return absl::FailedPreconditionError(absl::StrCat(t_.name, " has regions: SetRate would replace their shaping"));
  }
  for (const HostSpec& h : t_.hosts) {
    for (const auto& [ns, dev] : AccessLinkEgress(t_, h.name)) {
      (void)run_({"tc", "-n", ns, "qdisc", "del", "dev", dev, "root"});  // absent: nothing to delete
      if (mbit <= 0) continue;
      std::vector<std::string> argv = {"tc", "-n", ns, "qdisc", "add", "dev", dev, "root"};
      const std::vector<std::string> tbf = TbfArgs(mbit, h.queue_ms);
      argv.insert(argv.end(), tbf.begin(), tbf.end());
      absl::Status s = run_(argv);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Network::TcpGoodputTo(const std::string& host, int64_t bytes) {
  const std::string ip = t_.Address(host);
  if (ip.empty()) return absl::NotFoundError(absl::StrCat("no host \"", host, "\" in ", t_.name));
  // A socket belongs to the namespace its creating thread was in: create the sink's listening
  // socket on a thread that joined the host's namespace (setns affects that thread only).
  absl::StatusOr<TcpSink> sink = absl::InternalError("not started");
  std::thread([&] {
    const std::string path = "/run/netns/" + t_.Namespace(host);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      sink = absl::UnavailableError(absl::StrCat("cannot enter ", path, ": ", std::strerror(errno)));
    } else {
      sink = TcpSink::Listen(ip, 0, std::max<int64_t>(bytes, 0));
    }
    if (fd >= 0) close(fd);
  }).join();
  if (!sink.ok()) return sink.status();
  // One connection, then the sink closes: no socket may outlive the call and keep the host's
  // namespace (and its veth) alive after Down().
  const int port = sink->port();
  std::thread server([s = std::move(*sink)]() mutable { s.Serve(1); });
  // The probe's sender (in this namespace) uses the hosts' congestion control, as they do.
  const std::string congestion = t_.tcp_congestion == kMachineCongestion ? "" : t_.tcp_congestion;
  absl::StatusOr<double> seconds = TimedTcpSend(ip, port, bytes, absl::Seconds(5), congestion);
  if (!seconds.ok() && !TimedTcpSend(ip, port, 0).ok()) {
    server.detach();  // the sink is unreachable and stays blocked in accept; nothing else to do
    return seconds.status();
  }
  server.join();  // after the sink's one connection (the measurement, or the empty one above)
  if (!seconds.ok()) return seconds.status();
  return static_cast<double>(bytes) * 8 / *seconds / 1e6;
}

absl::StatusOr<std::vector<HostCounters>> Network::Counters() {
  std::vector<HostCounters> all;
  for (const HostSpec& h : t_.hosts) {
    HostCounters hc;
    hc.host = h.name;
    const std::array<Egress, 2> egress = AccessLinkEgress(t_, h.name);
    for (size_t i = 0; i < egress.size(); ++i) {
      absl::StatusOr<std::string> out =
          output_({"tc", "-s", "-n", egress[i].ns, "qdisc", "show", "dev", egress[i].dev, "root"});
      if (!out.ok()) return out.status();
      absl::StatusOr<QdiscCounters> q = ParseQdiscCounters(*out);
      if (!q.ok()) return q.status();
      (i == 0 ? hc.up : hc.down) = *q;
    }
    all.push_back(hc);
  }
  return all;
}

absl::Status Network::Down() {
  std::vector<std::string> errors;
  std::vector<std::string> all = {t_.SwitchNamespace()};
  for (const HostSpec& h : t_.hosts) all.push_back(t_.Namespace(h.name));
  for (const std::string& ns : all) {
    // A namespace that does not exist is already down; anything else is an error to report.
    absl::Status s = run_({"ip", "netns", "del", ns});
    if (!s.ok() && s.message().find("No such file") == std::string::npos) errors.push_back(std::string(s.message()));
  }
  if (!errors.empty()) return absl::InternalError(absl::StrJoin(errors, "\n"));
  // The kernel frees a deleted namespace, and the veths in it, asynchronously (a second or so
  // after the last socket in it closed): wait until the root namespace's end of the uplink is
  // gone, so that whatever runs next (an Up of the same network, a check) finds nothing left.
  const std::string uplink = "/sys/class/net/" + t_.name + "-up";
  for (int i = 0; i < 200 && std::filesystem::exists(uplink); ++i) absl::SleepFor(absl::Milliseconds(50));
  if (std::filesystem::exists(uplink)) {
    return absl::DeadlineExceededError(absl::StrCat("namespaces of ", t_.name, " deleted, but ", t_.name,
                                                    "-up still exists after 10 s"));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::netem
