// Load test: one amaq-server process (TLS, shared server LoRA, the base model) and 1, 8 and 16
// concurrent clients, each a thread of this program with its own gRPC channel, each running a
// bounded number of WordNet training steps. Reports steps/s over all clients, p50/p99 step
// latency, the server's resident memory (VmRSS at the end, VmHWM peak, from /proc) and the steps
// that failed, and each front door thread's share of a core (relay-N, /proc); every step must be
// applied exactly once (the server's Status agrees).
//   bench_load [SERVER_BINARY] [MODEL_DIR] [DATA_DIR] [STEPS] [FRONT_DOOR_THREADS]
//   (defaults: build/bin/amaq-server models/amaq-base data 20 1)
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "amaq/v1/split_training.grpc.pb.h"
#include "client/grpc_transport.h"
#include "client/split_client.h"
#include "common/text/datasets.h"
#include "common/model/threads.h"
#include "common/net/tls.h"
#include "process.h"

using namespace amaq;

namespace {

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int64_t AppliedSteps(const client::GrpcOptions& g) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(g.server_name);
  auto stub = amaq::v1::SplitTraining::NewStub(grpc::CreateCustomChannel(g.server, MakeChannelCredentials(g.tls, false), args));
  grpc::ClientContext context;
  amaq::v1::StatusRequest request;
  amaq::v1::StatusReply reply;
  if (!stub->Status(&context, request, &reply).ok()) return -1;
  int64_t steps = 0;
  for (const auto& c : reply.clients()) steps += c.steps();
  return steps;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string server_binary = argc > 1 ? argv[1] : "build/bin/amaq-server";
  const std::string model = argc > 2 ? argv[2] : "models/amaq-base";
  const std::string data = argc > 3 ? argv[3] : "data";
  const int64_t steps = argc > 4 ? std::stoll(argv[4]) : 20;
  const std::string front_door_threads = argc > 5 ? argv[5] : "1";
  SetComputeThreads(1);
  const std::string work = (std::filesystem::temp_directory_path() / "amaq-bench-load").string();
  std::filesystem::remove_all(work);
  if (std::system(("scripts/make-certs " + work).c_str()) != 0) return 1;
  Dataset wordnet = LoadWordNetTopics(data);
  wordnet.train.resize(2000);

  std::printf("load test: %lld steps per client, TLS on loopback, server threads 1, front door threads %s, %u cores; "
              "the last round sends large bf16 steps (batch 512: ~10 MiB up and down a step) to show the server returning "
              "memory\n",
              static_cast<long long>(steps), front_door_threads.c_str(), std::thread::hardware_concurrency());
  std::printf("%8s %-10s %6s %10s %10s %10s %14s %14s %8s %8s  %s\n", "clients", "method", "batch", "steps/s", "p50 ms", "p99 ms",
              "server RSS MiB", "server peak MiB", "failed", "applied", "front door CPU");
  struct Round {
    int clients;
    const char* method;
    int64_t batch;
  };
  for (const Round round : {Round{1, "amaq:8->3", 16}, Round{8, "amaq:8->3", 16}, Round{16, "amaq:8->3", 16},
                            Round{16, "bf16", 16}, Round{1, "bf16", 512}}) {
    const int clients = round.clients;
    const std::string port_file = work + "/port";
    std::filesystem::remove(port_file);
    testing::Process server({server_binary, "--model", model, "--listen", "127.0.0.1:0", "--port_file", port_file,
                             "--tls_cert", work + "/server.pem", "--tls_key", work + "/server.key", "--shared_lora",
                             "--threads", "1", "--front_door_threads", front_door_threads, "--log_level", "warn"},
                            work + "/server.log");
    const int port = testing::WaitForPortFile(port_file, 120);
    if (port == 0) {
      std::fprintf(stderr, "bench_load: the server did not start:\n%s\n", server.Log().c_str());
      return 1;
    }
    client::GrpcOptions g;
    g.server = "127.0.0.1:" + std::to_string(port);
    g.server_name = "localhost";
    g.tls.ca = work + "/ca.pem";
    std::vector<std::vector<client::StepRecord>> records(static_cast<size_t>(clients));
    std::atomic<int> failed{0};
    const auto cpu_before = testing::ThreadCpuSeconds(server.pid(), "relay-");
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        try {
          client::GrpcTransport transport(g);
          client::ClientOptions o;
          o.client_id = "load-" + std::to_string(i);
          o.model_dir = model;
          o.method = round.method;
          o.steps = steps;
          o.batch = round.batch;
          o.max_tokens = 48;
          o.progress = false;
          client::SplitClient c(o, wordnet, transport);
          int64_t step = c.Join();
          for (; step < steps; ++step) c.TrainStep(step);
          records[static_cast<size_t>(i)] = c.records();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "client %d failed: %s\n", i, e.what());
          ++failed;
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto cpu_after = testing::ThreadCpuSeconds(server.pid(), "relay-");
    std::vector<double> latency;
    for (const auto& r : records) {
      for (const auto& s : r) latency.push_back(s.seconds * 1e3);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the clients' streams have ended on the server
    std::printf("%8d %-10s %6lld %10.2f %10.1f %10.1f %14.0f %14.0f %8d %8lld  %s\n", clients, round.method,
                static_cast<long long>(round.batch), static_cast<double>(latency.size()) / seconds, Percentile(latency, 0.5), Percentile(latency, 0.99),
                testing::ProcStatusMiB(server.pid(), "VmRSS"), testing::ProcStatusMiB(server.pid(), "VmHWM"), failed.load(),
                static_cast<long long>(AppliedSteps(g)), testing::ThreadCpuShares(cpu_before, cpu_after, seconds).c_str());
    std::fflush(stdout);
  }
  return 0;
}
