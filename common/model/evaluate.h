// The metrics users see: classification accuracy by label likelihood, exact match of greedy
// generations, perplexity. They take the model as two small functions, so that the same code
// evaluates a local model and a split one whose head sits on a server:
//   SequenceScorer(batch)    -> [B, S] sum of log p(label token | prefix) over the positions with a
//                               label, per row (S = 1) or per candidate segment of a packed row
//   GreedyStep(ids, mask)    -> [B] the argmax next token after each row's last real token
// Exact match decodes through a GreedyDecoder (decoders.h): a KV cache for a whole model, or the
// GreedyStep again for every new token.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

#include "common/model/batching.h"

namespace amaq {

class GreedyDecoder;

using SequenceScorer = std::function<torch::Tensor(const Batch&)>;
using GreedyStep = std::function<torch::Tensor(const torch::Tensor& ids, const torch::Tensor& mask)>;

// From the logits at the labelled positions, AtLabels(logits, labels) [N, V] (model.h), labels
// [B, T] and the attention mask [B, T]: the sum of next-token log-probabilities of the labelled
// positions, [B, 1] for plain rows and [B, S] for rows packed with candidate segments 2..S+1
// (common/model/model.h; a segment a row lacks scores 0).
torch::Tensor SequenceLogProbs(const torch::Tensor& labelled_logits, const torch::Tensor& labels, const torch::Tensor& mask);
// From logits [B, T, V] and mask [B, T]: the argmax token after each row's last real token.
torch::Tensor LastTokenArgmax(const torch::Tensor& logits, const torch::Tensor& mask);
// From logits [B, T, V]: the argmax token after the last column (left-padded rows).
torch::Tensor LastColumnArgmax(const torch::Tensor& logits);

// Picks, for each example, the label whose completion is most likely; returns the share correct.
// Each example is a row that packs the labels as candidate segments after the prompt
// (ExampleEncoder::MakeCandidateBatch), so the prompt is computed once per row, not once per
// label; labels that do not fit one row of `max_row_tokens` (the model's positions) are spread
// over several (ExampleEncoder::CandidateGroups).
double ClassificationAccuracy(const SequenceScorer& score, const ExampleEncoder& encoder,
                              const Dataset& dataset, const std::vector<Example>& examples,
                              int64_t batch_size, int64_t max_row_tokens);
// Greedy decoding up to max_new_tokens or EOS; returns the share whose text equals the completion.
double ExactMatch(GreedyDecoder& decoder, const ExampleEncoder& encoder,
                  const std::vector<Example>& examples, int64_t max_new_tokens, int64_t batch_size);
// exp(mean negative log-likelihood per labelled token) over the batches.
double Perplexity(const SequenceScorer& score, const std::vector<Batch>& batches);

}  // namespace amaq
