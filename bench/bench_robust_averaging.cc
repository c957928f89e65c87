// Robust averaging against one Byzantine client (issue 41 item 4). Five clients fine-tune amaq-base
// on WordNet topics in collaborative mode, in one process (LocalTransport): per-client server LoRA,
// each client its own fifth of the training examples, the client adapters averaged every
// SYNC_EVERY steps. The fifth client either trains honestly or, at every averaging, uploads an
// adapter of all +1e4 (inside the server's value bounds). For each aggregate (mean, trimmed_mean)
// and seed it reports the four honest clients' mean accuracy on the first EVAL_EXAMPLES validation
// examples, with and without the Byzantine client (same seeds: paired), and the paired difference
// with its 95% t interval over the seeds.
//   bench_robust_averaging [MODEL_DIR] [DATA_DIR] [SEEDS] [STEPS] [EVAL_EXAMPLES] [SYNC_EVERY]
//   (defaults: models/amaq-base data 3 200 500 10)
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_clients.h"
#include "client/split_client.h"
#include "common/model/threads.h"
#include "common/text/datasets.h"
#include "inproc/local_transport.h"
#include "paired_interval.h"
#include "server/split_server.h"

using namespace amaq;

namespace {

constexpr int kClients = 5;

// A client's transport that, instead of its adapter, uploads one of the same names and shapes
// holding +1e4 everywhere (the largest value the server accepts).
class ByzantineTransport : public inproc::LocalTransport {
 public:
  using inproc::LocalTransport::LocalTransport;
  NamedFloats SyncAdapters(const NamedFloats& adapter) override {
    NamedFloats poison = adapter;
    for (auto& [name, t] : poison) t.values.assign(t.values.size(), server::SplitServer::kMaxAdapterValue);
    return inproc::LocalTransport::SyncAdapters(poison);
  }
};

// The honest clients' mean accuracy after `steps` steps of the five, averaging by `rule`.
double HonestAccuracy(const std::string& model, const Dataset& all, const std::string& rule, uint64_t seed,
                      bool byzantine, int64_t steps, int64_t eval_examples, int64_t sync_every) {
  server::ServerOptions so;
  so.model_dir = model;
  so.seed = seed;
  so.averaging.rule = rule;
  server::SplitServer server(so);
  std::vector<std::unique_ptr<inproc::LocalTransport>> transports;
  std::vector<std::unique_ptr<client::SplitClient>> clients;
  for (int k = 0; k < kClients; ++k) {
    bench::BenchClient c = bench::BenchClientOf(all, k, kClients, model, seed, steps, eval_examples);
    c.options.sync_every = sync_every;
    const bool bad = byzantine && k == kClients - 1;
    transports.push_back(bad ? std::make_unique<ByzantineTransport>(server) : std::make_unique<inproc::LocalTransport>(server));
    clients.push_back(std::make_unique<client::SplitClient>(c.options, std::move(c.data), *transports.back()));
    clients.back()->Join();
  }
  for (int64_t step = 0; step < steps; ++step) {
    for (auto& c : clients) c->TrainStep(step);
    if ((step + 1) % sync_every == 0) {
      for (auto& c : clients) c->SyncAdapters();
    }
  }
  double sum = 0;
  for (int k = 0; k < kClients - 1; ++k) sum += clients[static_cast<size_t>(k)]->Evaluate();
  return sum / (kClients - 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "models/amaq-base", data = argc > 2 ? argv[2] : "data";
  const int seeds = argc > 3 ? std::stoi(argv[3]) : 3;
  const int64_t steps = argc > 4 ? std::stoll(argv[4]) : 200, eval_examples = argc > 5 ? std::stoll(argv[5]) : 500;
  const int64_t sync_every = argc > 6 ? std::stoll(argv[6]) : 10;
  SetComputeThreads(2);
  spdlog::set_level(spdlog::level::warn);  // not a line per Join
  const Dataset wordnet = LoadWordNetTopics(data);
  std::printf("robust averaging: 5 clients, %s, WordNet topics, %lld steps each, averaged every %lld, honest clients' accuracy "
              "on %lld validation examples; the 5th client honest or uploading all +1e4\n",
              model.c_str(), static_cast<long long>(steps), static_cast<long long>(sync_every), static_cast<long long>(eval_examples));
  std::printf("%-13s %5s %10s %10s %10s\n", "aggregate", "seed", "honest", "byzantine", "difference");
  for (const std::string rule : {"trimmed_mean", "mean"}) {
    std::vector<double> differences;
    for (int seed = 1; seed <= seeds; ++seed) {
      const double honest = HonestAccuracy(model, wordnet, rule, static_cast<uint64_t>(seed), false, steps, eval_examples, sync_every);
      const double attacked = HonestAccuracy(model, wordnet, rule, static_cast<uint64_t>(seed), true, steps, eval_examples, sync_every);
      differences.push_back(attacked - honest);
      std::printf("%-13s %5d %10.4f %10.4f %+10.4f\n", rule.c_str(), seed, honest, attacked, attacked - honest);
      std::fflush(stdout);
    }
    const auto [mean, half] = bench::PairedDifference(differences);
    std::printf("%-13s  Byzantine - honest: %+.2f points, 95%% interval %+.2f..%+.2f (%d seeds)\n", rule.c_str(), 100 * mean,
                100 * (mean - half), 100 * (mean + half), seeds);
  }
  return 0;
}
