// Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p
// (nucleus) filtering, as Hugging Face's generate applies them (temperature, then top-k, then
// top-p; top-p keeps the smallest set of most likely tokens whose probability reaches p).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>

namespace amaq {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax); otherwise > 0
  int64_t top_k = 0;       // keep the k most likely tokens (0: all)
  double top_p = 1.0;      // keep the most likely tokens up to this probability mass, in (0, 1]
  // Throws amaq::Error (kInvalidArgument) naming the field that is out of range.
  void Validate() const;
};

// logits [B, V] -> tokens [B] (int64), drawing from `generator` unless greedy.
torch::Tensor SampleTokens(const torch::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

}  // namespace amaq
