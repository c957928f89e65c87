// Local (unsplit, uncompressed) LoRA fine-tuning: the reference that split training is compared
// against, and the measurement of how much a base model's pretraining helps.
//
//   load the model (or a randomly initialised one of the same shape), add LoRA, then for each step
//   take the next batch of training examples in a seeded random order, minimise the completion's
//   next-token loss with AdamW, and finally evaluate on the validation examples (accuracy by label
//   likelihood for classification, exact match of greedy generations otherwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/text/datasets.h"
#include "common/model/base_weights.h"
#include "common/model/lora.h"

namespace amaq {

struct FinetuneOptions {
  std::string model_dir;
  bool random_init = false;  // same architecture, weights not loaded
  BaseWeights base_weights = BaseWeights::kFp32;  // how the frozen base is held (base_weights.h)
  LoraConfig lora;
  double lr = 2e-3;
  int64_t steps = 300;
  int64_t batch = 16;
  int64_t max_tokens = 64;
  int64_t eval_examples = 300;  // first N validation examples
  int64_t eval_batch = 64;
  uint64_t seed = 1;
  bool progress = true;
};

struct FinetuneResult {
  std::vector<double> losses;  // one per step
  double metric = 0;           // accuracy or exact match on the evaluated validation examples
  double seconds = 0;
};

FinetuneResult FinetuneLocal(const Dataset& dataset, const FinetuneOptions& options);

// The order in which training examples are visited: a seeded shuffle, reshuffled every epoch.
class ExampleOrder {
 public:
  ExampleOrder(size_t examples, uint64_t seed);
  // The indices of the next `batch` examples.
  std::vector<size_t> Next(size_t batch);

 private:
  std::vector<size_t> order_;
  size_t at_ = 0;
  uint64_t seed_, epoch_ = 0;
};

}  // namespace amaq
