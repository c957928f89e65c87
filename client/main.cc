// amaq-client: trains the first layers of a model on this device's private data, with the rest on
// an amaq-server, compressing what crosses the cut with the chosen method. Settings: --config
// client.yaml and/or --key value flags (docs/configuration.md). Prints one summary line at the end.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

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

int Run(const Config& c) {
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  Dataset data = client::LoadTask(c);  // a data error stops the client before it connects
  client::GrpcTransport transport(client::GrpcOptionsFrom(c));

  const client::ClientOptions o = client::ClientOptionsFrom(c);
  if (o.base_weights != "fp32" || o.recompute_layers || o.compute_dtype != "fp32") ReturnLargeFreesToTheSystem();  // asked to save memory
  client::SplitClient split(o, std::move(data), transport);
  const double metric = split.Run();
  std::printf("client %s  method %s  steps %lld  metric %.4f  up %.3f MB  down %.3f MB  average bits %.2f\n",
              o.client_id.c_str(), o.method.c_str(), static_cast<long long>(o.steps), metric,
              static_cast<double>(transport.bytes_up()) / 1e6, static_cast<double>(transport.bytes_down()) / 1e6,
              split.average_bits());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config = client::ClientConfig();
  return RunProgram(config, argc, argv, Run, client::CheckClientConfig);
}
