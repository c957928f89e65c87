// Does a replica set's parameter averaging cost accuracy against one server (issue 56 item 3)?
// Four clients fine-tune amaq-base on WordNet topics with one shared server LoRA (shared_lora), in
// one process (LocalTransport), each on its own quarter of the training examples, in turns:
// every round each client makes one step. Arms, on the same seeds (paired):
//   one server        the four clients on one SplitServer (every step sees every earlier one);
//   2 replicas / K    clients 0 and 2 on replica 0, 1 and 3 on replica 1: two SplitServers that
//                     form a replica set on loopback (server/replica_group.h) and average the
//                     shared LoRA (ReplicaSync::SynchronizeNow, what replica_sync_seconds runs on
//                     a clock) after every K rounds, K = 1 and SYNC_EVERY.
// It prints each arm's mean accuracy of the four clients on the first EVAL_EXAMPLES validation
// examples per seed, and each replica arm's paired difference from one server with its 95% t
// interval over the seeds. The tune split is fine here: no setting is chosen on it.
//   bench_replica_averaging [MODEL_DIR] [DATA_DIR] [SEEDS] [ROUNDS] [EVAL_EXAMPLES] [SYNC_EVERY]
//   (defaults: models/amaq-base data 3 100 500 10)
#include <spdlog/spdlog.h>

#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "bench_clients.h"
#include "client/split_client.h"
#include "common/model/threads.h"
#include "common/text/datasets.h"
#include "inproc/local_transport.h"
#include "paired_interval.h"
#include "replica_test_util.h"
#include "server/replica_sync.h"
#include "server/split_server.h"

using namespace amaq;

namespace {

constexpr int kClients = 4;

// One replica: its server, its place in the set and its synchronisation (driven by hand).
struct Replica {
  std::unique_ptr<server::SplitServer> server;
  std::unique_ptr<server::ReplicaGroup> group;
  std::unique_ptr<server::ReplicaSync> sync;
};

// The four clients' mean accuracy after `rounds` rounds on `replicas` servers (1: one server),
// averaging the shared LoRA after every `sync_every` rounds when there are two.
double MeanAccuracy(const std::string& model, const Dataset& all, uint64_t seed, int replicas, int64_t rounds,
                    int64_t eval_examples, int64_t sync_every) {
  server::ServerOptions so;
  so.model_dir = model;
  so.seed = seed;
  so.shared_lora = true;
  std::vector<Replica> set(static_cast<size_t>(replicas));
  for (auto& r : set) r.server = std::make_unique<server::SplitServer>(so);
  if (replicas > 1) {
    const testing::LoopbackReplicas loopback(replicas);
    std::vector<std::future<std::unique_ptr<server::ReplicaGroup>>> joins;
    for (int r = 0; r < replicas; ++r) {
      joins.push_back(std::async(std::launch::async, server::ReplicaGroup::Join, loopback.options[static_cast<size_t>(r)],
                                 server::IdentityOf(*set[static_cast<size_t>(r)].server, so)));
    }
    for (int r = 0; r < replicas; ++r) {
      Replica& replica = set[static_cast<size_t>(r)];
      replica.group = joins[static_cast<size_t>(r)].get();
      replica.sync = std::make_unique<server::ReplicaSync>(*replica.server, *replica.group, 1e9);  // by hand only
    }
  }
  std::vector<std::unique_ptr<inproc::LocalTransport>> transports;
  std::vector<std::unique_ptr<client::SplitClient>> clients;
  for (int k = 0; k < kClients; ++k) {
    bench::BenchClient c = bench::BenchClientOf(all, k, kClients, model, seed, rounds, eval_examples);
    c.options.micro_batches = 1;  // a shared LoRA takes whole steps
    transports.push_back(std::make_unique<inproc::LocalTransport>(*set[static_cast<size_t>(k % replicas)].server));
    clients.push_back(std::make_unique<client::SplitClient>(c.options, std::move(c.data), *transports.back()));
    clients.back()->Join();
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (auto& c : clients) c->TrainStep(round);
    if (replicas > 1 && (round + 1) % sync_every == 0) {
      std::vector<std::future<bool>> averages;  // a collective: every replica at once
      for (auto& r : set) averages.push_back(std::async(std::launch::async, [&r] { return r.sync->SynchronizeNow(); }));
      for (auto& a : averages) {
        if (!a.get()) throw std::runtime_error("an average over the replicas failed: see the log");
      }
    }
  }
  double sum = 0;
  for (auto& c : clients) sum += c->Evaluate();
  return sum / kClients;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "models/amaq-base", data = argc > 2 ? argv[2] : "data";
  const int seeds = argc > 3 ? std::stoi(argv[3]) : 3;
  const int64_t rounds = argc > 4 ? std::stoll(argv[4]) : 100, eval_examples = argc > 5 ? std::stoll(argv[5]) : 500;
  const int64_t sync_every = argc > 6 ? std::stoll(argv[6]) : 10;
  SetComputeThreads(1);
  spdlog::set_level(spdlog::level::err);  // not a line per Join, nor the cut examples' warning per client
  const Dataset wordnet = LoadWordNetTopics(data);
  std::printf("replica averaging: 4 clients, shared server LoRA, %s, WordNet topics, %lld rounds (a step of each client), "
              "mean accuracy on %lld validation examples\n",
              model.c_str(), static_cast<long long>(rounds), static_cast<long long>(eval_examples));
  const std::vector<int64_t> periods = {1, sync_every};
  std::printf("%5s %12s", "seed", "one server");
  for (int64_t k : periods) std::printf(" %16s", ("2 replicas / " + std::to_string(k)).c_str());
  std::printf("\n");
  std::vector<std::vector<double>> differences(periods.size());
  for (int seed = 1; seed <= seeds; ++seed) {
    const double one = MeanAccuracy(model, wordnet, static_cast<uint64_t>(seed), 1, rounds, eval_examples, 1);
    std::printf("%5d %12.4f", seed, one);
    for (size_t p = 0; p < periods.size(); ++p) {
      const double two = MeanAccuracy(model, wordnet, static_cast<uint64_t>(seed), 2, rounds, eval_examples, periods[p]);
      differences[p].push_back(two - one);
      std::printf(" %16.4f", two);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (size_t p = 0; p < periods.size(); ++p) {
    const auto [mean, half] = bench::PairedDifference(differences[p]);
    std::printf("2 replicas averaging every %lld rounds - one server: %+.2f points, 95%% interval %+.2f..%+.2f (%d seeds)\n",
                static_cast<long long>(periods[p]), 100 * mean, 100 * (mean - half), 100 * (mean + half), seeds);
  }
  return 0;
}
