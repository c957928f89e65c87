// amaq-client: trains the first layers of a model on this device's private data, with the rest on
// an amaq-server, compressing what crosses the cut with the chosen method. Settings: --config
// client.yaml and/or --key value flags (docs/configuration.md). Prints one summary line at the end.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <thread>
#include <utility>

#include "client/grpc_transport.h"
#include "client/client_config.h"
#include "client/split_client.h"
#include "common/base/config.h"
#include "common/base/error.h"
#include "common/base/memory.h"
#include "common/base/program.h"
#include "common/model/threads.h"

using namespace amaq;

namespace {

// SIGINT or SIGTERM: the first sets `stop` (SplitClient stops after the step in flight, with a
// checkpoint), a second ends the process at once.
void WatchStopSignals(std::atomic<int>& stop) {
  stop = WaitForStopSignal();
  spdlog::warn("stopping after the step in flight, with a checkpoint (signal again to stop at once)");
  const int again = WaitForStopSignal();
  spdlog::warn("stopped at once: the last checkpoint written is where the same command continues");
  std::_Exit(128 + again);
}

int Run(const Config& c) {
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  static std::atomic<int> stop{0};  // read by the client's thread, set by the watcher's until exit
  std::thread(WatchStopSignals, std::ref(stop)).detach();
  Dataset data = client::LoadTask(c);  // a data error stops the client before it connects
  client::GrpcTransport transport(client::GrpcOptionsFrom(c));

  client::ClientOptions o = client::ClientOptionsFrom(c);
  o.stop = &stop;
  // Asked to save memory. Not for bf16 compute alone: its activations are already half as large,
  // and the page faults of fresh mappings cost it a fifth of its speed (docs/benchmarks.md).
  if (o.base_weights != "fp32" || o.recompute_layers) ReturnLargeFreesToTheSystem();
  client::SplitClient split(o, std::move(data), transport);
  double metric = 0;
  try {
    metric = split.Run();
  } catch (const client::Interrupted& i) {
    if (i.checkpointed) {
      spdlog::warn("client {}: interrupted at step {}: run the same command to continue", o.client_id, i.steps_done);
    } else if (o.checkpoint_dir.empty()) {
      spdlog::warn("client {}: interrupted at step {}; without a checkpoint_dir nothing is kept: set checkpoint_dir to "
                   "continue runs, and start this one again with --fresh", o.client_id, i.steps_done);
    } else {
      spdlog::warn("client {}: interrupted at step {}, whose checkpoint failed (above): run the same command to continue "
                   "from the checkpoint kept", o.client_id, i.steps_done);
    }
    return 128 + i.signal;
  }
  std::printf("client %s  method %s  steps %lld  metric %.4f  up %.3f MB  down %.3f MB  average bits %.2f\n",
              o.client_id.c_str(), o.method.c_str(), static_cast<long long>(o.steps), metric,
              static_cast<double>(transport.bytes_up()) / 1e6, static_cast<double>(transport.bytes_down()) / 1e6,
              split.average_bits());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: the watcher of Run takes them
  Config config = client::ClientConfig();
  return RunProgram(config, argc, argv, Run, client::CheckClientConfig);
}
