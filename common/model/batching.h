// Turning examples and text into the tensors a model step takes.
//
// A fine-tuning example is  [BOS] prompt " " completion [EOS]  with labels = the input ids on the
// completion and EOS, -100 elsewhere (prompt, padding), right-padded to the longest in the batch
// and cut at max_tokens. Pretraining batches are windows of a token stream.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/text/datasets.h"
#include "common/text/tokenizer.h"

namespace amaq {

struct Batch {
  torch::Tensor ids;     // [B, T] int64
  torch::Tensor mask;    // [B, T] int64: 1 token, 0 padding, k >= 2 candidate segment (model.h)
  torch::Tensor labels;  // [B, T] int64: target token or -100
  std::vector<uint64_t> sample_ids;  // stable ids of the examples (AQ-SGD caches by them)
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

  // One row per example that packs every candidate completion after the shared prompt, for
  // scoring them all in one pass: BOS + the prompt without its last token (mask 1), then for
  // candidate k the prompt's last token, the candidate's tokens and EOS (mask k + 2, labels on the
  // candidate and EOS). Segment k computes what MakeBatch's row of (prompt, candidate k) would;
  // a prompt too long for max_tokens is cut at its beginning as for the longest candidate.
  Batch MakeCandidateBatch(const std::vector<const Example*>& examples, const std::vector<std::string>& candidates) const;
  // `candidates` in order, split into groups whose packed rows stay within `max_row_tokens` (the
  // model's positions, which a server also enforces) after a prompt of up to max_tokens: each
  // candidate counts its tokens, its EOS and the prompt token before it, plus one for a
  // tokenization that differs after the prompt. Throws amaq::Error (kInvalidArgument) when one
  // candidate alone does not fit.
  std::vector<std::vector<std::string>> CandidateGroups(const std::vector<std::string>& candidates,
                                                        int64_t max_row_tokens) const;

  const Tokenizer& tokenizer() const { return tokenizer_; }
  int64_t eos_id() const { return eos_; }

 private:
  const Tokenizer& tokenizer_;
  int64_t bos_, eos_, max_tokens_;
};

// Random windows of `tokens` + 1 consecutive ids from a token stream, for next-token pretraining.
Batch SampleWindows(const std::vector<int32_t>& stream, int64_t batch, int64_t tokens, std::mt19937_64& rng);

}  // namespace amaq
