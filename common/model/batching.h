// Turning examples and text into the tensors a model step takes.
//
// A fine-tuning example is  [BOS] prompt " " completion [EOS]  with labels = the input ids on the
// completion and EOS, -100 elsewhere (prompt, padding), right-padded to the longest in the batch
// and cut at max_tokens. Pretraining batches are windows of a token stream.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/base/split_step.h"
#include "common/text/datasets.h"
#include "common/text/tokenizer.h"

namespace amaq {

struct Batch {
  torch::Tensor ids;     // [B, T] int64
  torch::Tensor mask;    // [B, T] int64: 1 token, 0 padding
  torch::Tensor labels;  // [B, T] int64: target token or -100
  std::vector<uint64_t> sample_ids;  // stable ids of the examples (AQ-SGD caches by them)
};

// Rows of candidate completions to score: ids and mask as Batch's (mask k + 2: candidate k), and
// what each candidate's score sums (split_step.h).
struct CandidateBatch {
  torch::Tensor ids;   // [B, T] int64
  torch::Tensor mask;  // [B, T] int64
  ScoreTargets targets;
};

class ExampleEncoder {
 public:
  // `tokenizer` must outlive the encoder.
  ExampleEncoder(const Tokenizer& tokenizer, int64_t bos_id, int64_t eos_id, int64_t max_tokens);

  // Token ids of prompt and completion such that prompt_ids + completion_ids tokenizes
  // prompt + " " + completion.
  struct Pair {
    std::vector<int64_t> prompt, completion;
  };
  Pair Encode(const std::string& prompt, const std::string& completion) const;

  // One batch of examples with their stable ids. `with_completion` = false leaves the completion
  // out (prompts for generation).
  // `pad_to` > 0 pads every row to exactly that many tokens (AQ-SGD needs fixed shapes).
  Batch MakeBatch(const std::vector<const Example*>& examples, const std::vector<uint64_t>& sample_ids,
                  bool with_completion = true, int64_t pad_to = 0) const;

  // One row per example that scores every candidate completion in one pass (CandidateBatch):
  // BOS, the prompt and the tokens every candidate begins with (mask 1), then each candidate's
  // remaining tokens as segment k + 2 for candidate k (model.h: it sees the context and its own
  // earlier tokens, at the positions the row prompt + candidate alone would give them). A
  // candidate's score sums log p of its tokens and EOS, each read at the position before it: the
  // context's last token is read once for every candidate's first token. A prompt too long for
  // max_tokens is cut at its beginning as MakeBatch cuts the row of the longest candidate.
  CandidateBatch MakeCandidateBatch(const std::vector<const Example*>& examples, const std::vector<std::string>& candidates) const;
  // `candidates` in order, split into groups whose rows stay within `max_row_tokens` (the model's
  // positions, which a server also enforces) after a prompt of up to max_tokens: each candidate
  // counts its tokens plus one for a tokenization that differs after the prompt. Throws
  // amaq::Error (kInvalidArgument) when one candidate alone does not fit.
  std::vector<std::vector<std::string>> CandidateGroups(const std::vector<std::string>& candidates,
                                                        int64_t max_row_tokens) const;

  // The number of tokens of `prompt` (to order examples by length).
  int64_t PromptTokens(const std::string& prompt) const { return static_cast<int64_t>(tokenizer_.Encode(prompt).size()); }

  const Tokenizer& tokenizer() const { return tokenizer_; }
  int64_t eos_id() const { return eos_; }

 private:
  const Tokenizer& tokenizer_;
  int64_t bos_, eos_, max_tokens_;
};

// Random windows of `tokens` + 1 consecutive ids from a token stream, for next-token pretraining.
Batch SampleWindows(const std::vector<int32_t>& stream, int64_t batch, int64_t tokens, std::mt19937_64& rng);

}  // namespace amaq
