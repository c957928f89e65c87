#include "common/net/netem_config.h"

#include <cstdint>

#include "common/base/program.h"
#include "common/net/host_port.h"

namespace amaq {

Config NetemConfig() {
  Config c("amaq-netem");
  c.AddString("upstream", "127.0.0.1:50051", "host:port of the server to forward to");
  c.AddString("listen", "127.0.0.1:0", "IP address and port to accept clients on (port 0: any free port)");
  c.AddString("port_file", "", "write the port actually bound to this file (for scripts using port 0)");
  c.AddDouble("up_mbit", 0, "bandwidth towards the server in Mbit/s (0: unlimited)", 0, 1e6);
  c.AddDouble("down_mbit", 0, "bandwidth towards the client in Mbit/s (0: unlimited)", 0, 1e6);
  c.AddInt("burst_kb", 16, "depth of each direction's token bucket in KiB", 1, 1 << 20);
  c.AddDouble("latency_ms", 0, "one-way delay added in each direction", 0, 1e6);
  c.AddDouble("jitter_ms", 0, "extra one-way delay, uniform in [0, jitter]", 0, 1e6);
  c.AddInt("reset_after_bytes", -1, "close every connection once this many bytes crossed (-1: never)", -1, INT64_MAX);
  c.AddDouble("reset_at", -1, "close every connection this many seconds after start (-1: never)", -1, 1e9);
  c.AddDouble("stall_at", -1, "hold all traffic from this many seconds after start (-1: never)", -1, 1e9);
  c.AddDouble("stall_for", 0, "how long the stall lasts, in seconds", 0, 1e9);
  c.AddDouble("blackhole_at", -1, "drop all traffic from this many seconds after start (-1: never)", -1, 1e9);
  c.AddInt("seed", 1, "seed of the jitter", 0, INT64_MAX);
  c.AddDouble("report_seconds", 10, "log the traffic carried this often (0: never)", 0, 1e6);
  AddProgramKeys(c);
  return c;
}

void CheckNetemConfig(const Config& c) {
  SplitHostPort(c.String("upstream"), "upstream");
  SplitHostPort(c.String("listen"), "listen");
}

}  // namespace amaq
