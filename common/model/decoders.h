// Greedy decoding of a batch of prompts, one new token per row and call, two ways:
//   CachedDecoder       a whole model with a KV cache: the prompts once (prefill), then one token
//                       per call through every layer (ModelPart::ForwardCached);
//   RecomputingDecoder  any GreedyStep (a split model whose head is on a server): the sequences
//                       are run whole again for every new token.
// Both give the same tokens for the same model; ExactMatch (evaluate.h) takes either.
#pragma once

#include <torch/torch.h>

#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace amaq {

class GreedyDecoder {
 public:
  virtual ~GreedyDecoder() = default;
  // Starts on right-padded prompts, ids and mask [B, T] (mask 1 token, 0 padding; every row holds
  // a token); returns each row's greedy next token [B] (int64, CPU). Forgets earlier sequences.
  virtual torch::Tensor Start(const torch::Tensor& ids, const torch::Tensor& mask) = 0;
  // Appends tokens [B] (one per row) and returns each row's greedy next token.
  virtual torch::Tensor Next(const torch::Tensor& tokens) = 0;
};

class CachedDecoder : public GreedyDecoder {
 public:
  // `model` holds the embedding and the head; it is shared, not copied.
  explicit CachedDecoder(ModelPart model);
  torch::Tensor Start(const torch::Tensor& ids, const torch::Tensor& mask) override;
  torch::Tensor Next(const torch::Tensor& tokens) override;
  // The same steps with the next-token logits [B, V] (fp32, CPU) for sampling.
  torch::Tensor StartLogits(const torch::Tensor& ids, const torch::Tensor& mask);
  torch::Tensor NextLogits(const torch::Tensor& tokens);

 private:
  ModelPart model_;
  KvCache cache_;
};

class RecomputingDecoder : public GreedyDecoder {
 public:
  explicit RecomputingDecoder(GreedyStep step) : step_(std::move(step)) {}
  torch::Tensor Start(const torch::Tensor& ids, const torch::Tensor& mask) override;
  torch::Tensor Next(const torch::Tensor& tokens) override;

 private:
  GreedyStep step_;
  torch::Tensor ids_, mask_;  // right-padded sequences so far
};

}  // namespace amaq
