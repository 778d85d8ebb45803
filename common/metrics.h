// Prometheus metrics for the daemons (library longhaul_metrics; only the coordinator and the worker
// link it, so the CLI and the benchmarks stay free of prometheus-cpp).
//
//   std::shared_ptr<prometheus::Registry> r = common::MetricsRegistry();     // process-wide
//   auto& steps = prometheus::BuildCounter().Name("longhaul_stage_steps_total").Help("...").Register(*r);
//   absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("0.0.0.0:9465", r);
//   (*s)->OnScrape([&] { /* refresh gauges computed from state */ });
//   (*s)->Serve("/sd", "application/json", [&] { return DiscoveryJson(); });
//
// The HTTP server is a small one of ours (one thread, one request per connection, GET only), not
// prometheus::Exposer: the coordinator also serves Prometheus service discovery (`/sd`) on the same
// port, which Exposer has no handler for, and Exposer's CivetWeb cannot start its threads in the
// worker (mg_start: "Cannot create first worker thread"; by all signs its compiled-in 100 KiB
// thread stacks are smaller than the worker's static TLS: OpenBLAS, glog and LibTorch, ~110 KiB). /metrics is prometheus-cpp's text serialisation of the
// registry (format 0.0.4).
//
// Every server also exports the process metrics (longhaul_process_resident_memory_bytes, from
// /proc/self/statm), refreshed at each scrape.
//
// Threading: the registry and its metrics are thread-safe (prometheus-cpp). The server answers
// requests one at a time on its own thread: OnScrape callbacks and Serve bodies run there and must
// not block for long. OnScrape and Serve may be called from any thread; the destructor stops the
// server thread (and so waits for a request being answered).
#ifndef LONGHAUL_COMMON_METRICS_H_
#define LONGHAUL_COMMON_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace longhaul::common {

// The process-wide registry every module registers its metric families in.
std::shared_ptr<prometheus::Registry> MetricsRegistry();

// Whether `name` follows longhaul's naming rules (docs/observability.md): the prefix longhaul_,
// lower snake case, and for a counter the suffix _total; a histogram of time ends in _seconds.
// A string saying what is wrong, or "" when it is fine. Used by the tests over every family.
std::string CheckMetricName(const std::string& name, prometheus::MetricType type);

// "none" (metrics off) -> false; anything else is an address to listen on.
inline bool MetricsEnabled(const std::string& listen) { return listen != "none" && !listen.empty(); }

// The host:port others use to reach a server listening on `listen` at `port`: `advertise_host` when
// set, else the listen host, with 0.0.0.0 / [::] / "" replaced by 127.0.0.1.
std::string AdvertisedAddress(const std::string& listen, int port, const std::string& advertise_host);

class MetricsServer;

// A daemon's --metrics-listen: null for "none"; otherwise a server on the process-wide registry.
// When `fallback_to_free_port` (the flag was left at its default, e.g. several workers on one host)
// and the address cannot be served, a free port on the same host is used instead and `*note` says
// so; an address given explicitly must work.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  bool fallback_to_free_port, std::string* note);

class MetricsServer {
 public:
  // Listens on `listen` (HOST:PORT, port 0 picks a free one) and serves /metrics from `registry`.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // Runs before every /metrics scrape, in the order added (gauges derived from state).
  void OnScrape(std::function<void()> refresh);
  // Serves `path` (exactly) with the body `body()` returns.
  void Serve(const std::string& path, const std::string& content_type, std::function<std::string()> body);

 private:
  struct Handler {
    std::string content_type;
    std::function<std::string()> body;
  };
  explicit MetricsServer(std::shared_ptr<prometheus::Registry> registry);
  void Loop();             // the server thread: accept, answer, close
  void Answer(int conn);
  std::string Scrape();

  std::shared_ptr<prometheus::Registry> registry_;
  int fd_ = -1;               // listening socket
  int wake_[2] = {-1, -1};    // a pipe: the destructor wakes the server thread
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::function<void()>> refresh_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::common

#endif  // LONGHAUL_COMMON_METRICS_H_
