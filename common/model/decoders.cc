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

std::pair<torch::Tensor, torch::Tensor> LeftAligned(const torch::Tensor& ids, const torch::Tensor& mask) {
  const int64_t b = ids.size(0), t = ids.size(1);
  const torch::Tensor lengths = mask.to(torch::kLong).sum(1);
  torch::Tensor left_ids = torch::zeros({b, t}, torch::kLong), left_mask = torch::zeros({b, t}, torch::kLong);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t n = lengths[r].item<int64_t>();
    left_ids[r].slice(0, t - n).copy_(ids[r].to(torch::kLong).masked_select(mask[r] == 1));
    left_mask[r].slice(0, t - n).fill_(1);
  }
  return {left_ids, left_mask};
}

CachedDecoder::CachedDecoder(ModelPart whole)
    : CachedDecoder(whole, [](const torch::Tensor& logits, const torch::Tensor&, bool) {
        return LastColumnArgmax(logits).to(torch::kCPU);
      }) {
  Require(whole->spec().head, ErrorCode::kInvalidArgument,
          "a cached decoder without a rest runs a whole model: give it a part with the embedding and the head");
}

CachedDecoder::CachedDecoder(ModelPart first, Rest rest) : part_(std::move(first)), rest_(std::move(rest)) {
  Require(part_->spec().embed, ErrorCode::kInvalidArgument, "a cached decoder starts from token ids: its part needs the embedding");
}

std::pair<torch::Tensor, torch::Tensor> CachedDecoder::Prefill(const torch::Tensor& ids, const torch::Tensor& mask) {
  CheckPrompts(ids, mask);
  torch::NoGradGuard no_grad;
  const auto [left_ids, left_mask] = LeftAligned(ids, mask);
  ids_ = left_ids;
  mask_ = left_mask;
  cache_ = KvCache{};
  return {part_->ForwardCached(left_ids.to(part_->device()), left_mask.to(part_->device()), cache_), left_mask};
}

torch::Tensor CachedDecoder::Extend(const torch::Tensor& tokens) {
  Require(cache_.length() > 0 && tokens.dim() == 1 && tokens.size(0) == cache_.seen.size(0), ErrorCode::kInvalidArgument,
          "Next needs one token per row of the prompts given to Start: call Start first");
  torch::NoGradGuard no_grad;
  const torch::Tensor column = tokens.to(torch::kCPU, torch::kLong).unsqueeze(1);
  ids_ = torch::cat({ids_, column}, 1);
  mask_ = torch::cat({mask_, torch::ones_like(column)}, 1);
  const torch::Tensor ids = column.to(cache_.seen.device());
  return part_->ForwardCached(ids, torch::ones_like(ids), cache_);
}

torch::Tensor CachedDecoder::Start(const torch::Tensor& ids, const torch::Tensor& mask) {
  const auto [output, left_mask] = Prefill(ids, mask);
  return rest_(output, left_mask, /*start=*/true);
}

torch::Tensor CachedDecoder::Next(const torch::Tensor& tokens) {
  const torch::Tensor output = Extend(tokens);
  try {
    return rest_(output, torch::ones({tokens.size(0), 1}, torch::kLong), /*start=*/false);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFailedPrecondition) throw;
  }
  const torch::Tensor ids = ids_, mask = mask_;  // the rest lost the sequences: start them again
  const auto [again, left_mask] = Prefill(ids, mask);
  return rest_(again, left_mask, /*start=*/true);
}

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
