// Greedy decoding of a batch of prompts, one new token per row and call, two ways:
//   CachedDecoder       a KV cache: the prompts once (prefill), then one token per call
//                       (ModelPart::ForwardCached), through a whole model, or through the first
//                       part of a split model and then `rest` (the server, with a cache of its own);
//   RecomputingDecoder  any GreedyStep: the sequences are run whole again for every new token.
// Both give the same tokens for the same model; ExactMatch (evaluate.h) takes either.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>

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

// Rows [B, T] with their tokens (mask 1) moved, in order, to the right end (left padding), so that
// every row's last token is the last column: {ids, mask}.
std::pair<torch::Tensor, torch::Tensor> LeftAligned(const torch::Tensor& ids, const torch::Tensor& mask);

class CachedDecoder : public GreedyDecoder {
 public:
  // What follows the part: its output for the new positions ([B, t, *]: logits or hidden
  // states), their mask, and whether they start the sequences (the prompts) -> next tokens [B].
  using Rest = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& mask, bool start)>;
  // A whole model (embedding and head): the next token is the argmax of the last position.
  explicit CachedDecoder(ModelPart whole);
  // The first part of a split model (with the embedding) and what runs the rest. When `rest`
  // throws amaq::Error kFailedPrecondition for appended tokens (it lost the sequences: a server
  // restarted or the client rejoined), Next starts the sequences again from every token so far.
  CachedDecoder(ModelPart first, Rest rest);
  torch::Tensor Start(const torch::Tensor& ids, const torch::Tensor& mask) override;
  torch::Tensor Next(const torch::Tensor& tokens) override;
  // The part's own steps: its output for the prompts, left-aligned ({output [B, T, *], mask}), and
  // for one appended token per row ([B, 1, *]). Parts are shared, not copied.
  std::pair<torch::Tensor, torch::Tensor> Prefill(const torch::Tensor& ids, const torch::Tensor& mask);
  torch::Tensor Extend(const torch::Tensor& tokens);

 private:
  ModelPart part_;
  Rest rest_;
  KvCache cache_;
  torch::Tensor ids_, mask_;  // the sequences so far, left-aligned (to start them again)
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
