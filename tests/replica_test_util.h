// Replicas of one run in threads of a test process: a rendezvous on a free loopback port and each
// rank's options (server/replica_group.h).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "server/replica_group.h"

namespace amaq::testing {

// A loopback port free at the time of the call (bound to port 0, read, closed); std::runtime_error
// when the system gives none. No gtest here: bench/bench_replica_sync.cc uses it too.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool bound = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (fd >= 0) close(fd);
  if (!bound) throw std::runtime_error("no free loopback port: check that 127.0.0.1 is up");
  return ntohs(address.sin_port);
}

// `n` replicas' options: rank 0's store on a free loopback port, public addresses 127.0.0.1:5010<rank>.
struct LoopbackReplicas {
  explicit LoopbackReplicas(int n, double timeout_seconds = 60)
      : rendezvous("127.0.0.1:" + std::to_string(FreeLoopbackPort())) {
    for (int r = 0; r < n; ++r) {
      server::ReplicaOptions o;
      o.replicas = n;
      o.rank = r;
      o.rendezvous = rendezvous;
      o.public_address = "127.0.0.1:" + std::to_string(50100 + r);
      o.timeout_seconds = timeout_seconds;
      options.push_back(o);
    }
  }
  std::string rendezvous;
  std::vector<server::ReplicaOptions> options;
};

}  // namespace amaq::testing
