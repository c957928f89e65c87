// The metrics users see: classification accuracy by label likelihood, exact match of greedy
// generations, perplexity. They take the model as small functions, so that the same code
// evaluates a local model and a split one whose head sits on a server:
//   CandidateScorer(batch)   -> [B, candidates] each candidate's sum of log-probabilities
//                               (ScoreTargets, batching.h): TargetLogProbs on the model's output
//   SequenceScorer(batch)    -> [B, 1] sum of log p(label token | prefix) over a row's labels
//   GreedyStep(ids, mask)    -> [B] the argmax next token after each row's last real token
// Exact match decodes through a GreedyDecoder (decoders.h): a KV cache for a whole model, or the
// GreedyStep again for every new token.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/model/batching.h"

namespace amaq {

class GreedyDecoder;

using CandidateScorer = std::function<torch::Tensor(const CandidateBatch&)>;
using SequenceScorer = std::function<torch::Tensor(const Batch&)>;
using GreedyStep = std::function<torch::Tensor(const torch::Tensor& ids, const torch::Tensor& mask)>;

// The candidates' scores [rows, targets.count] from the hidden states `hidden` [B, T, H] that
// `head` ([N, H] -> [N, V] logits: the final norm and LM head) turns into logits: each target adds
// its token's logit minus the logsumexp of its position's logits, in fp32. The head runs once per
// distinct target position, at most kHeadRowsAtOnce positions at a time (split_step.h), so no
// [N, V] tensor of every target is held. Throws amaq::Error (kInvalidArgument) for a target
// outside the batch.
torch::Tensor TargetLogProbs(const torch::Tensor& hidden, const std::function<torch::Tensor(const torch::Tensor&)>& head,
                             const ScoreTargets& targets);
// From the logits at the labelled positions, AtLabels(logits, labels) [N, V] (model.h), and the
// labels [B, T]: the sum of next-token log-probabilities of each row's labelled positions, [B, 1].
torch::Tensor SequenceLogProbs(const torch::Tensor& labelled_logits, const torch::Tensor& labels);
// From logits [B, T, V] and mask [B, T]: the argmax token after each row's last real token.
torch::Tensor LastTokenArgmax(const torch::Tensor& logits, const torch::Tensor& mask);
// From logits [B, T, V]: the argmax token after the last column (left-padded rows).
torch::Tensor LastColumnArgmax(const torch::Tensor& logits);

// Picks, for each example, the label whose completion is most likely; returns the share correct
// and, when `predicted` is given, each example's chosen label there (in the examples' order). Each example is a row that scores
// every label after one prompt (ExampleEncoder::MakeCandidateBatch); labels that do not fit one
// row of `max_row_tokens` (the model's positions) are spread over several
// (ExampleEncoder::CandidateGroups). Examples are batched in order of their prompts' length, so
// that a batch's rows are padded little.
double ClassificationAccuracy(const CandidateScorer& score, const ExampleEncoder& encoder,
                              const Dataset& dataset, const std::vector<Example>& examples,
                              int64_t batch_size, int64_t max_row_tokens,
                              std::vector<std::string>* predicted = nullptr);
// Greedy decoding up to max_new_tokens or EOS; returns the share whose text equals the completion
// and, when `predicted` is given, each example's generated text there.
double ExactMatch(GreedyDecoder& decoder, const ExampleEncoder& encoder, const std::vector<Example>& examples,
                  int64_t max_new_tokens, int64_t batch_size, std::vector<std::string>* predicted = nullptr);
// exp(mean negative log-likelihood per labelled token) over the batches.
double Perplexity(const SequenceScorer& score, const std::vector<Batch>& batches);

}  // namespace amaq
