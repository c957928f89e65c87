// What one synchronisation of a shared server LoRA costs a replica set (issue 56 item 6;
// docs/benchmarks.md): REPLICAS replicas in threads of one process meet at a c10d TCPStore on
// loopback and form a Gloo group (server/replica_group.h), then average a server LoRA in place
// (ReplicaGroup::AverageInPlace, what ReplicaSync runs every replica_sync_seconds) REPEATS times
// after two unmeasured ones; rank 0 prints the median and the spread per LoRA size.
//
// The LoRA sizes are those of a server part with every projection adapted (q, k, v, o, gate, up,
// down; a projection of in x out features adds rank x (in + out) parameters) for three models cut
// after layer 2: SmolLM2-135M (hidden 576, MLP 1536, key/value 192, 30 layers), TinyLlama-1.1B
// (2048, 5632, 256, 22) and LLaMA-2-7B's shape (4096, 11008, 4096, 32), at ranks 8, 16 and 64.
// On loopback this measures the collective's own cost (copies, reduction, Gloo's ring over TCP on
// one host), not a network's: docs/benchmarks.md adds the link on paper.
//   bench_replica_sync [REPLICAS] [REPEATS]   (defaults: 2 20)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "replica_test_util.h"
#include "server/replica_group.h"

using namespace amaq;

namespace {

struct Shape {
  const char* model;
  int64_t hidden, mlp, key_value, layers;
};

// Parameters of the server part's LoRA: layers [2, layers), every projection at `rank`.
int64_t ServerLoraParameters(const Shape& s, int64_t rank) {
  const int64_t h = s.hidden, per_layer = rank * ((h + h) + 2 * (h + s.key_value) + (h + h) + 2 * (h + s.mlp) + (s.mlp + h));
  return (s.layers - 2) * per_layer;
}

struct Timing {
  double median_ms, min_ms, max_ms;
};

// Each rank's thread: forms the set, then averages `parameters` floats `repeats` + 2 times.
void Rank(const server::ReplicaOptions& options, const std::vector<int64_t>& sizes, int repeats,
          std::vector<Timing>* timings) {
  const std::unique_ptr<server::ReplicaGroup> group = server::ReplicaGroup::Join(options, {{"bench", "replica-sync"}});
  for (const int64_t parameters : sizes) {
    const torch::Tensor lora = torch::full({parameters}, static_cast<float>(options.rank));
    std::vector<double> ms;
    for (int i = 0; i < repeats + 2; ++i) {
      const auto started = std::chrono::steady_clock::now();
      group->AverageInPlace({lora});
      if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
    }
    const float expected = static_cast<float>(options.replicas - 1) / 2;
    if (lora[0].item<float>() != expected && options.rank == 0) {
      std::fprintf(stderr, "bench_replica_sync: the average is %g, not %g: the collective is broken\n", lora[0].item<float>(),
                   expected);
      std::exit(1);
    }
    std::sort(ms.begin(), ms.end());
    if (options.rank == 0) timings->push_back({ms[ms.size() / 2], ms.front(), ms.back()});
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int replicas = argc > 1 ? std::atoi(argv[1]) : 2;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
  if (replicas < 2 || repeats < 1) {
    std::fprintf(stderr, "usage: bench_replica_sync [REPLICAS >= 2] [REPEATS >= 1]\n");
    return 2;
  }
  torch::set_num_threads(1);
  const std::vector<Shape> shapes = {{"SmolLM2-135M", 576, 1536, 192, 30},
                                     {"TinyLlama-1.1B", 2048, 5632, 256, 22},
                                     {"LLaMA-2-7B", 4096, 11008, 4096, 32}};
  std::vector<std::pair<std::string, int64_t>> rows;
  std::vector<int64_t> sizes;
  for (const Shape& s : shapes) {
    for (const int64_t rank : {8, 16, 64}) {
      rows.emplace_back(std::string(s.model) + ", rank " + std::to_string(rank), ServerLoraParameters(s, rank));
      sizes.push_back(rows.back().second);
    }
  }
  const testing::LoopbackReplicas set(replicas);
  std::vector<Timing> timings;
  std::vector<std::thread> threads;
  for (const auto& options : set.options) threads.emplace_back(Rank, options, sizes, repeats, &timings);
  for (auto& t : threads) t.join();
  std::printf("%d replicas on loopback, %d averages each after 2 unmeasured, one process\n\n", replicas, repeats);
  std::printf("| server LoRA | parameters | MB (fp32) | median ms | min - max ms | MB/s averaged |\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const double mb = static_cast<double>(rows[i].second) * 4 / 1e6;
    std::printf("| %s | %lld | %.1f | %.1f | %.1f - %.1f | %.0f |\n", rows[i].first.c_str(),
                static_cast<long long>(rows[i].second), mb, timings[i].median_ms, timings[i].min_ms, timings[i].max_ms,
                mb / (timings[i].median_ms / 1e3));
  }
  return 0;
}
