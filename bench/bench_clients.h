// Client k of n for the benchmarks that train several clients in one process
// (bench_robust_averaging, bench_replica_averaging): its share of `all`'s training examples
// (examples i with i % n == k; validation as in `all`) and options with docs/study.md's WordNet
// settings (48 tokens), named client-k, without a progress bar. Callers add their own settings.
#pragma once

#include <cstdint>
#include <string>

#include "client/split_client.h"
#include "common/text/datasets.h"

namespace amaq::bench {

struct BenchClient {
  client::ClientOptions options;
  Dataset data;
};

inline BenchClient BenchClientOf(const Dataset& all, int k, int n, const std::string& model, uint64_t seed, int64_t steps,
                                 int64_t eval_examples) {
  BenchClient c;
  c.data = all;
  c.data.train.clear();
  for (size_t i = static_cast<size_t>(k); i < all.train.size(); i += static_cast<size_t>(n)) c.data.train.push_back(all.train[i]);
  c.options.client_id = "client-" + std::to_string(k);
  c.options.model_dir = model;
  c.options.seed = seed;
  c.options.steps = steps;
  c.options.max_tokens = 48;
  c.options.eval_examples = eval_examples;
  c.options.progress = false;
  return c;
}

}  // namespace amaq::bench
