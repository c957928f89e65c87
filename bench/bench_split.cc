// The split-training system on this machine, over gRPC + TLS on loopback, with the base model and
// WordNet: per-step time of one client, split into client compute, compression (encode the
// activation, decode the gradient), server compute and the rest of the exchange (transfer,
// queueing), for each method. Throughput with many clients is bench_load's.
//   bench_split [MODEL_DIR] [DATA_DIR]     (defaults: models/amaq-base data)
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <filesystem>

#include "client/grpc_transport.h"
#include "client/split_client.h"
#include "common/text/datasets.h"
#include "common/model/threads.h"
#include "server/grpc_service.h"
#include "server/split_server.h"

using namespace amaq;

namespace {

struct Fixture {
  std::string model, certs;
  std::unique_ptr<server::SplitServer> split;
  std::unique_ptr<server::TokenStore> tokens;
  std::unique_ptr<server::SplitTrainingService> service;
  std::unique_ptr<grpc::Server> grpc;
  int port = 0;

  Fixture(const std::string& model_dir, const std::string& cert_dir) : model(model_dir), certs(cert_dir) {
    server::ServerOptions o;
    o.model_dir = model;
    o.cut_layer = 2;  // each client its own server LoRA (the default), so steps may come in parts
    split = std::make_unique<server::SplitServer>(o);
    tokens = std::make_unique<server::TokenStore>("");
    service = std::make_unique<server::SplitTrainingService>(*split, *tokens, server::ServiceOptions{});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", MakeServerCredentials(TlsFiles{certs + "/server.pem", certs + "/server.key", ""}, false), &port);
    builder.RegisterService(service.get());
    grpc = builder.BuildAndStart();
  }
  ~Fixture() { grpc->Shutdown(); }

  client::GrpcOptions Transport() const {
    client::GrpcOptions g;
    g.server = "127.0.0.1:" + std::to_string(port);
    g.server_name = "localhost";
    g.tls.ca = certs + "/ca.pem";
    return g;
  }
};

client::ClientOptions Options(const std::string& model, const std::string& id, const std::string& method, int64_t steps,
                              int64_t micro_batches) {
  client::ClientOptions o;
  o.micro_batches = micro_batches;
  o.client_id = id;
  o.model_dir = model;
  o.method = method;
  o.steps = steps;
  o.batch = 16;
  o.max_tokens = 48;
  o.progress = false;
  return o;
}

// One run of 25 steps over gRPC on loopback; prints the mean of steps 5-24.
void Report(const std::string& model, const std::string& certs, const Dataset& data, const std::string& method,
            int64_t parts) {
  Fixture f(model, certs);
  client::GrpcTransport transport(f.Transport());
  client::SplitClient c(Options(model, "bench", method, 25, parts), data, transport);
  int64_t step = c.Join();
  for (; step < 25; ++step) c.TrainStep(step);
  double client = 0, codec = 0, server = 0, network = 0, total = 0, up = 0;
  for (int i = 5; i < 25; ++i) {
    const client::StepRecord& r = c.records()[static_cast<size_t>(i)];
    client += r.client_seconds / 20;
    codec += r.encode_seconds / 20;
    server += r.server_seconds / 20;
    network += r.network_seconds / 20;
    total += r.seconds / 20;
    up += static_cast<double>(r.up.total()) / 20 / 1024;
  }
  std::printf("%-16s %5lld %8.1f %8.1f %8.1f %8.1f %8.1f %10.1f\n", method.c_str(), static_cast<long long>(parts),
              client * 1e3, codec * 1e3, server * 1e3, network * 1e3, total * 1e3, up);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "models/amaq-base";
  const std::string data = argc > 2 ? argv[2] : "data";
  SetComputeThreads(1);
  const std::string certs = (std::filesystem::temp_directory_path() / "amaq-bench-certs").string();
  if (std::system(("scripts/make-certs " + certs).c_str()) != 0) return 1;
  Dataset wordnet = LoadWordNetTopics(data);
  wordnet.train.resize(2000);

  std::printf("per-step time of one client (batch 16, up to 48 tokens, cut after layer 2, TLS on loopback), "
              "mean of steps 5-24, milliseconds:\n");
  std::printf("%-16s %5s %8s %8s %8s %8s %8s %10s\n", "method", "parts", "client", "codec", "server", "network", "total",
              "KB up/step");
  for (const std::string method : {"bf16", "fixed:8:channel", "fixed:4:channel", "fixed:3:channel", "aqsgd:4", "amaq:8->3"}) {
    for (const int64_t parts : {1, 4}) Report(model, certs, wordnet, method, parts);
  }

  return 0;
}
