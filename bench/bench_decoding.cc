// Exact-match evaluation with and without the KV cache: the same greedy decoding of the verbs
// task's validation prompts (batches of 32, up to 12 new tokens) through CachedDecoder (the
// prompt once, then one token per step) and RecomputingDecoder (every sequence again for each new
// token, what a split evaluation does through the server). Both must find the same exact match.
//   bench_decoding [MODEL_DIR] [DATA_DIR] [EXAMPLES] [THREADS]   (defaults: models/amaq-base data 256 2)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/model/batching.h"
#include "common/model/checkpoint.h"
#include "common/model/decoders.h"
#include "common/model/evaluate.h"
#include "common/model/threads.h"
#include "common/text/datasets.h"

using namespace amaq;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "models/amaq-base", data = argc > 2 ? argv[2] : "data";
  const size_t examples = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 256;
  SetComputeThreads(argc > 4 ? std::atoi(argv[4]) : 2);
  const ModelConfig c = ModelConfig::Load(dir + "/config.json");
  ModelPart model(c, PartSpec::Whole(c));
  LoadPartWeights(model, dir);
  model->eval();
  const auto tokenizer = Tokenizer::Load(dir);
  const ExampleEncoder encoder(*tokenizer, c.bos_token_id, c.eos_token_id, 64);
  const Dataset verbs = LoadVerbPastTense(data);
  const std::vector<Example> eval(verbs.validation.begin(), verbs.validation.begin() + std::min(examples, verbs.validation.size()));
  const auto time = [&](GreedyDecoder& decoder, double* metric) {
    const auto start = std::chrono::steady_clock::now();
    *metric = ExactMatch(decoder, encoder, eval, 12, 32);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  CachedDecoder cached(model);
  RecomputingDecoder recomputing([&](const torch::Tensor& ids, const torch::Tensor& mask) {
    return LastTokenArgmax(model(ids, mask), mask);
  });
  double cached_metric = 0, recomputed_metric = 0;
  time(cached, &cached_metric);  // warm-up
  const double with_cache = time(cached, &cached_metric);
  const double without = time(recomputing, &recomputed_metric);
  std::printf("exact match of %zu verbs prompts (batch 32, <= 12 new tokens), %s, %d threads\n", eval.size(), dir.c_str(),
              argc > 4 ? std::atoi(argv[4]) : 2);
  std::printf("  recomputing: %.2f s (%.1f examples/s), exact match %.4f\n", without, eval.size() / without, recomputed_metric);
  std::printf("  KV cache:    %.2f s (%.1f examples/s), exact match %.4f\n", with_cache, eval.size() / with_cache, cached_metric);
  std::printf("  speed-up %.2fx%s\n", without / with_cache, cached_metric == recomputed_metric ? "" : "  (METRICS DIFFER)");
  return cached_metric == recomputed_metric ? 0 : 1;
}
