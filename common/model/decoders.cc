#include "common/model/decoders.h"

#include "common/base/error.h"

namespace amaq {
namespace {

void CheckPrompts(const torch::Tensor& ids, const torch::Tensor& mask) {
  Require(ids.dim() == 2 && mask.sizes() == ids.sizes() && ids.size(0) > 0 && ids.size(1) > 0,
          ErrorCode::kInvalidArgument, "prompts must be ids and mask of one shape [batch, tokens], batch and tokens >= 1");
  Require((mask.sum(1) > 0).all().item<bool>(), ErrorCode::kInvalidArgument,
          "every prompt needs at least one token: drop empty prompts");
}

}  // namespace

CachedDecoder::CachedDecoder(ModelPart model) : model_(std::move(model)) {
  Require(model_->spec().embed && model_->spec().head, ErrorCode::kInvalidArgument,
          "a cached decoder runs a whole model: give it a part with the embedding and the head");
}

torch::Tensor CachedDecoder::StartLogits(const torch::Tensor& ids, const torch::Tensor& mask) {
  CheckPrompts(ids, mask);
  torch::NoGradGuard no_grad;
  // Left-align the padding, so that every row's last token is the last column and new tokens
  // append as one column.
  const int64_t b = ids.size(0), t = ids.size(1);
  const torch::Tensor lengths = mask.to(torch::kLong).sum(1);
  torch::Tensor left_ids = torch::zeros({b, t}, torch::kLong), left_mask = torch::zeros({b, t}, torch::kLong);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t n = lengths[r].item<int64_t>();
    left_ids[r].slice(0, t - n).copy_(ids[r].slice(0, 0, n));
    left_mask[r].slice(0, t - n).fill_(1);
  }
  cache_ = KvCache{};
  const torch::Device device = model_->norm->weight.device();
  const torch::Tensor logits = model_->ForwardCached(left_ids.to(device), left_mask.to(device), cache_);
  return logits.select(1, t - 1).to(torch::kCPU, torch::kFloat);
}

torch::Tensor CachedDecoder::NextLogits(const torch::Tensor& tokens) {
  Require(cache_.length() > 0 && tokens.dim() == 1 && tokens.size(0) == cache_.seen.size(0), ErrorCode::kInvalidArgument,
          "Next needs one token per row of the prompts given to Start: call Start first");
  torch::NoGradGuard no_grad;
  const torch::Device device = cache_.seen.device();
  const torch::Tensor ids = tokens.to(device, torch::kLong).unsqueeze(1);
  const torch::Tensor logits = model_->ForwardCached(ids, torch::ones_like(ids), cache_);
  return logits.select(1, 0).to(torch::kCPU, torch::kFloat);
}

torch::Tensor CachedDecoder::Start(const torch::Tensor& ids, const torch::Tensor& mask) {
  return StartLogits(ids, mask).argmax(-1);
}

torch::Tensor CachedDecoder::Next(const torch::Tensor& tokens) { return NextLogits(tokens).argmax(-1); }

torch::Tensor RecomputingDecoder::Start(const torch::Tensor& ids, const torch::Tensor& mask) {
  CheckPrompts(ids, mask);
  ids_ = ids.to(torch::kLong);
  mask_ = mask.to(torch::kLong);
  return step_(ids_, mask_).to(torch::kCPU);
}

torch::Tensor RecomputingDecoder::Next(const torch::Tensor& tokens) {
  Require(ids_.defined() && tokens.dim() == 1 && tokens.size(0) == ids_.size(0), ErrorCode::kInvalidArgument,
          "Next needs one token per row of the prompts given to Start: call Start first");
  // Each row's token goes right after its last real token (rows are right-padded).
  const torch::Tensor at = mask_.sum(1);
  ids_ = torch::cat({ids_, torch::zeros({ids_.size(0), 1}, torch::kLong)}, 1);
  mask_ = torch::cat({mask_, torch::zeros({mask_.size(0), 1}, torch::kLong)}, 1);
  const torch::Tensor rows = torch::arange(ids_.size(0), torch::kLong);
  ids_.index_put_({rows, at}, tokens.to(torch::kLong));
  mask_.index_put_({rows, at}, torch::ones_like(at));
  return step_(ids_, mask_).to(torch::kCPU);
}

}  // namespace amaq
