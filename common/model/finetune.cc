#include "common/model/finetune.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "common/model/batching.h"
#include "common/model/checkpoint.h"
#include "common/base/error.h"
#include "common/model/decoders.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "common/base/progress.h"
#include "common/text/tokenizer.h"

namespace amaq {

ExampleOrder::ExampleOrder(size_t examples, uint64_t seed) : order_(examples), seed_(seed) {
  Require(examples > 0, ErrorCode::kInvalidArgument, "the training split is empty");
  std::iota(order_.begin(), order_.end(), 0);
  std::shuffle(order_.begin(), order_.end(), std::mt19937_64(seed_));
}

std::vector<size_t> ExampleOrder::Next(size_t batch) {
  std::vector<size_t> out;
  while (out.size() < batch) {
    if (at_ == order_.size()) {
      at_ = 0;
      std::shuffle(order_.begin(), order_.end(), std::mt19937_64(seed_ + ++epoch_));
    }
    out.push_back(order_[at_++]);
  }
  return out;
}

FinetuneResult FinetuneLocal(const Dataset& dataset, const FinetuneOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  const ModelConfig config = ModelConfig::Load(o.model_dir + "/config.json");
  const auto tokenizer = Tokenizer::Load(o.model_dir);
  torch::manual_seed(o.seed);
  ModelPart model(config, PartSpec::Whole(config), o.base_weights);
  if (!o.random_init) LoadPartWeights(model, o.model_dir);
  model->AddLora(o.lora, o.seed);
  torch::optim::AdamW optimizer(model->TrainableParameters(), torch::optim::AdamWOptions(o.lr).weight_decay(0.0));
  const ExampleEncoder encoder(*tokenizer, config.bos_token_id, config.eos_token_id, o.max_tokens);

  FinetuneResult result;
  ExampleOrder order(dataset.train.size(), o.seed);
  Progress progress("finetune", o.steps);
  model->train();
  for (int64_t step = 0; step < o.steps; ++step) {
    std::vector<const Example*> examples;
    std::vector<uint64_t> ids;
    for (size_t i : order.Next(static_cast<size_t>(o.batch))) {
      examples.push_back(&dataset.train[i]);
      ids.push_back(i);
    }
    const Batch b = encoder.MakeBatch(examples, ids);
    const torch::Tensor loss = NextTokenLoss(model->LogitsAtLabels(b.ids, b.mask, b.labels), b.labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    result.losses.push_back(loss.item<double>());
    if (o.progress) progress.Update(step + 1, "loss " + std::to_string(result.losses.back()));
  }

  model->eval();
  const std::vector<Example> eval(dataset.validation.begin(),
                                  dataset.validation.begin() + std::min<int64_t>(o.eval_examples, dataset.validation.size()));
  if (dataset.is_classification()) {
    const CandidateScorer score = [&](const CandidateBatch& b) {
      return TargetLogProbs(model->Body(b.ids, b.mask), [&](const torch::Tensor& x) { return model->Head(x); }, b.targets);
    };
    result.metric = ClassificationAccuracy(score, encoder, dataset, eval, o.eval_batch, config.max_position_embeddings);
  } else {
    CachedDecoder decoder(model);
    result.metric = ExactMatch(decoder, encoder, eval, 12, o.eval_batch);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (o.progress) progress.Finish((dataset.is_classification() ? "accuracy " : "exact match ") + std::to_string(result.metric));
  return result;
}

}  // namespace amaq
