// amaq-netem: a link emulator between split-training clients and the server. It listens on
// --listen and forwards each connection to --upstream through an emulated link: a bandwidth per
// direction (token bucket), a one-way latency with jitter, and scheduled faults (reset every
// connection after N bytes or at time T, stall all traffic for S seconds, blackhole). Point a
// client's `server` at it to preview a link; the tests and scripts/bench-network use it the same way.
//   amaq-netem --upstream 127.0.0.1:50051 --listen 127.0.0.1:50061 --up_mbit 10 --down_mbit 10 --latency_ms 20
// It logs the traffic it carried every --report_seconds and stops on SIGINT/SIGTERM.
#include <spdlog/spdlog.h>

#include <fstream>

#include "common/base/config.h"
#include "common/net/netem_config.h"
#include "common/base/program.h"
#include "common/net/host_port.h"
#include "common/net/tcp_relay.h"

using namespace amaq;

namespace {

int Run(const Config& c) {
  LinkOptions link;
  link.up_bits_per_second = c.Double("up_mbit") * 1e6;
  link.down_bits_per_second = c.Double("down_mbit") * 1e6;
  link.burst_bytes = static_cast<uint64_t>(c.Int("burst_kb")) << 10;
  link.latency_seconds = c.Double("latency_ms") / 1e3;
  link.jitter_seconds = c.Double("jitter_ms") / 1e3;
  link.reset_after_bytes = c.Int("reset_after_bytes");
  link.reset_at_seconds = c.Double("reset_at");
  link.stall_at_seconds = c.Double("stall_at");
  link.stall_seconds = c.Double("stall_for");
  link.blackhole_at_seconds = c.Double("blackhole_at");
  link.seed = static_cast<uint64_t>(c.Int("seed"));
  const auto [host, port] = SplitHostPort(c.String("upstream"), "upstream");
  TcpRelay relay(host, port, link, c.String("listen"));
  if (!c.String("port_file").empty()) std::ofstream(c.String("port_file")) << relay.port() << "\n";
  const auto rate = [](double mbit) { return mbit > 0 ? fmt::format("{} Mbit/s", mbit) : std::string("unlimited"); };
  spdlog::info("amaq-netem: port {} -> {}: up {}, down {}, latency {} ms + jitter {} ms", relay.port(), c.String("upstream"),
               rate(c.Double("up_mbit")), rate(c.Double("down_mbit")), c.Double("latency_ms"), c.Double("jitter_ms"));

  const double every = c.Double("report_seconds");
  uint64_t last_up = 0, last_down = 0;
  while (WaitForStopSignal(every) == 0) {  // every report_seconds until SIGINT/SIGTERM
    const uint64_t up = relay.bytes_up(), down = relay.bytes_down();
    spdlog::info("carried up {:.2f} MB ({:.2f} Mbit/s), down {:.2f} MB ({:.2f} Mbit/s), {} resets", up / 1e6,
                 (up - last_up) * 8 / every / 1e6, down / 1e6, (down - last_down) * 8 / every / 1e6, relay.resets());
    last_up = up;
    last_down = down;
  }
  spdlog::info("amaq-netem: stopped after up {} bytes, down {} bytes", relay.bytes_up(), relay.bytes_down());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BlockStopSignals();
  Config config = NetemConfig();
  return RunProgram(config, argc, argv, Run, CheckNetemConfig);
}
