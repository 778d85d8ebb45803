// Test harness: N ranks of one collective group inside the test process, over the in-process
// transport or over real gRPC on loopback (each rank its own server and CollectiveService), one
// thread per rank.
#ifndef LONGHAUL_TESTS_COLLECTIVE_HARNESS_H_
#define LONGHAUL_TESTS_COLLECTIVE_HARNESS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "collective/grpc_transport.h"
#include "collective/group.h"
#include "collective/in_process_transport.h"
#include "proto/channel_config.h"

namespace longhaul::collective::testing {

enum class Kind { kInProcess, kGrpc };
inline const char* KindName(Kind k) { return k == Kind::kInProcess ? "InProcess" : "Grpc"; }

struct ClusterOptions {
  absl::Duration timeout = absl::Seconds(60);
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  netem::LinkProfile link;  // every directed link
};

class Cluster {
 public:
  Cluster(Kind kind, std::vector<std::string> regions, ClusterOptions o = {}) : kind_(kind) {
    const int n = static_cast<int>(regions.size());
    Topology topo = *Topology::Create(regions);
    if (kind == Kind::kInProcess) {
      InProcessHubOptions h;
      h.max_message_bytes = o.max_message_bytes;
      if (o.link.shaped()) h.link = [l = o.link](int, int) { return l; };
      hub_ = std::make_unique<InProcessHub>(n, h);
      for (int r = 0; r < n; ++r) transports_.push_back(hub_->Connect(r));
    } else {
      std::vector<std::string> addresses;
      for (int r = 0; r < n; ++r) {
        Server s;
        s.service = std::make_unique<CollectiveService>();
        grpc::ServerBuilder b;
        ConfigureLonghaulServer(&b);
        int port = 0;
        b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        b.RegisterService(s.service.get());
        s.server = b.BuildAndStart();
        addresses.push_back("127.0.0.1:" + std::to_string(port));
        servers_.push_back(std::move(s));
      }
      for (int r = 0; r < n; ++r) {
        GrpcTransportOptions t;
        t.group = "test-group";
        t.rank = r;
        t.addresses = addresses;
        t.max_message_bytes = o.max_message_bytes;
        if (o.link.shaped() || o.link.paced()) t.links.assign(static_cast<size_t>(n), o.link);
        transports_.push_back(*GrpcTransport::Create(servers_[r].service.get(), t));
      }
      addresses_ = addresses;
    }
    GroupOptions g;
    g.timeout = o.timeout;
    for (int r = 0; r < n; ++r) groups_.push_back(std::make_unique<Group>(transports_[r].get(), topo, g));
  }

  ~Cluster() {
    groups_.clear();
    transports_.clear();
    for (Server& s : servers_) {
      if (s.server) s.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    }
  }

  int size() const { return static_cast<int>(groups_.size()); }
  Group& group(int r) { return *groups_[r]; }
  Transport& transport(int r) { return *transports_[r]; }
  const std::string& address(int r) const { return addresses_[r]; }
  CollectiveService* service(int r) { return servers_[r].service.get(); }

  // Rank r's process dies: in-process, the hub marks it down; over gRPC its server stops.
  void Kill(int r) {
    if (kind_ == Kind::kInProcess) {
      hub_->Kill(r);
    } else {
      servers_[r].server->Shutdown(absl::ToChronoTime(absl::Now()));
      servers_[r].server.reset();
    }
    dead_.push_back(r);
  }

  // fn(rank) on one thread per live rank; returns when all are done.
  void Run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      if (std::find(dead_.begin(), dead_.end(), r) == dead_.end()) threads.emplace_back(fn, r);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  struct Server {
    std::unique_ptr<CollectiveService> service;
    std::unique_ptr<grpc::Server> server;
  };
  Kind kind_;
  std::unique_ptr<InProcessHub> hub_;
  std::vector<Server> servers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<int> dead_;
};

}  // namespace longhaul::collective::testing

#endif  // LONGHAUL_TESTS_COLLECTIVE_HARNESS_H_
