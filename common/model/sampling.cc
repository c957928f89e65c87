#include "common/model/sampling.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "common/base/error.h"

namespace amaq {

void SamplingOptions::Validate() const {
  Require(std::isfinite(temperature) && temperature >= 0, ErrorCode::kInvalidArgument,
          "temperature " + std::to_string(temperature) + " must be >= 0 (0: greedy)");
  Require(top_k >= 0, ErrorCode::kInvalidArgument, "top_k " + std::to_string(top_k) + " must be >= 0 (0: no limit)");
  Require(top_p > 0 && top_p <= 1, ErrorCode::kInvalidArgument, "top_p " + std::to_string(top_p) + " must be in (0, 1]");
}

torch::Tensor SampleTokens(const torch::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  o.Validate();
  Require(logits.dim() == 2 && logits.size(1) > 0, ErrorCode::kInvalidArgument, "logits must be [batch, vocabulary]");
  if (o.temperature == 0) return logits.argmax(-1);
  const double minus_inf = -std::numeric_limits<double>::infinity();
  torch::Tensor scaled = logits.to(torch::kFloat) / o.temperature;
  if (o.top_k > 0 && o.top_k < scaled.size(1)) {
    const torch::Tensor kth = std::get<0>(scaled.topk(o.top_k, -1)).slice(1, o.top_k - 1);  // [B, 1]
    scaled = scaled.masked_fill(scaled < kth, minus_inf);
  }
  if (o.top_p < 1) {
    const auto [sorted, order] = scaled.sort(-1, /*descending=*/true);
    const torch::Tensor probs = torch::softmax(sorted, -1);
    // A token goes when the tokens before it already reach top_p; the most likely always stays.
    const torch::Tensor drop = (probs.cumsum(-1) - probs) >= o.top_p;
    scaled = scaled.scatter(-1, order, sorted.masked_fill(drop, minus_inf));
  }
  return torch::multinomial(torch::softmax(scaled, -1), 1, /*replacement=*/false, generator).squeeze(1);
}

}  // namespace amaq
