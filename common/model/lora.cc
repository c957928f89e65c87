#include "common/model/lora.h"

#include <algorithm>
#include <cmath>

#include "common/base/error.h"

namespace amaq {

namespace {
const std::vector<std::string> kKnownTargets = {"q_proj", "k_proj",  "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
}

bool LoraConfig::Targets(const std::string& module) const {
  return std::find(target_modules.begin(), target_modules.end(), module) != target_modules.end();
}

void LoraConfig::Validate() const {
  Require(rank > 0, ErrorCode::kInvalidArgument, "lora.rank must be positive, got " + std::to_string(rank));
  Require(alpha > 0, ErrorCode::kInvalidArgument, "lora.alpha must be positive");
  Require(dropout >= 0 && dropout < 1, ErrorCode::kInvalidArgument, "lora.dropout must be in [0, 1)");
  Require(!target_modules.empty(), ErrorCode::kInvalidArgument,
          "lora.target_modules is empty: name at least one of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  for (const std::string& t : target_modules) {
    Require(std::find(kKnownTargets.begin(), kKnownTargets.end(), t) != kKnownTargets.end(),
            ErrorCode::kInvalidArgument,
            "lora.target_modules names '" + t + "': use q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  }
}

LoraLinearImpl::LoraLinearImpl(int64_t in_features, int64_t out_features, bool with_bias, BaseWeights format)
    : in_features_(in_features), out_features_(out_features), format_(format) {
  const torch::Tensor w = torch::empty({out_features, in_features}).normal_(0, 0.02);
  if (format_ == BaseWeights::kFp32) {
    weight = register_parameter("weight", w);
  } else {
    frozen_ = FrozenWeight::Store(w, format_);
  }
  if (with_bias) bias = register_parameter("bias", torch::zeros({out_features}));
}

void LoraLinearImpl::AddAdapter(const LoraConfig& config) {
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in_features_, config.rank).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(config.rank, out_features_).bias(false)));
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(lora_A->weight, std::sqrt(5.0));
  lora_B->weight.zero_();
  const torch::Dtype dtype = weight.defined() ? weight.scalar_type() : torch::kFloat;
  lora_A->weight.set_data(lora_A->weight.to(dtype));
  lora_B->weight.set_data(lora_B->weight.to(dtype));
  dropout = register_module("lora_dropout", torch::nn::Dropout(config.dropout));
  scaling = config.alpha / static_cast<double>(config.rank);
  if (weight.defined()) weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  // Parameters are cast to x's dtype at use (a no-op when they agree), so gradients reach them in theirs.
  const auto as_x = [&](const torch::Tensor& p) { return p.defined() ? p.to(x.scalar_type()) : p; };
  torch::Tensor y;
  if (frozen_) {
    y = frozen_->Linear(x);
    if (bias.defined()) y = y + as_x(bias);
  } else {
    y = F::linear(x, as_x(weight), as_x(bias));
  }
  if (!has_adapter()) return y;
  if (group_starts_.empty()) return y + LowRank(x, lora_A->weight, lora_B->weight) * scaling;
  Require(x.size(0) == group_starts_.back(), ErrorCode::kInvalidArgument,
          "a batch of " + std::to_string(x.size(0)) + " rows for LoRA row groups over " + std::to_string(group_starts_.back()) +
              " rows: set the row groups of this batch");
  std::vector<torch::Tensor> groups;
  for (size_t g = 0; g < group_adapters_.size(); ++g) {
    const torch::Tensor rows = x.slice(0, group_starts_[g], group_starts_[g + 1]);
    groups.push_back(LowRank(rows, group_adapters_[g].first, group_adapters_[g].second));
  }
  return y + torch::cat(groups, 0) * scaling;
}

torch::Tensor LoraLinearImpl::LowRank(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
  namespace F = torch::nn::functional;
  return F::linear(F::linear(dropout(x), a.to(x.scalar_type())), b.to(x.scalar_type()));
}

void LoraLinearImpl::SetRowGroups(std::vector<int64_t> starts, std::vector<std::pair<torch::Tensor, torch::Tensor>> adapters) {
  Require(has_adapter(), ErrorCode::kInvalidArgument, "LoRA row groups on a projection without an adapter: add LoRA first");
  bool ascending = !adapters.empty() && starts.size() == adapters.size() + 1 && starts.front() == 0;
  for (size_t g = 0; ascending && g + 1 < starts.size(); ++g) ascending = starts[g] < starts[g + 1];
  Require(ascending, ErrorCode::kInvalidArgument,
          "LoRA row groups need one more start than adapters, ascending from 0: give each adapter its rows");
  group_starts_ = std::move(starts);
  group_adapters_ = std::move(adapters);
}

void LoraLinearImpl::ClearRowGroups() {
  group_starts_.clear();
  group_adapters_.clear();
}

void LoraLinearImpl::Merge() {
  if (!has_adapter()) return;
  torch::NoGradGuard no_grad;
  if (frozen_) {
    weight = register_parameter("weight", frozen_->Dense(lora_A->weight.scalar_type()), /*requires_grad=*/false);
    frozen_.reset();
    format_ = BaseWeights::kFp32;
  }
  weight.add_(torch::matmul(lora_B->weight, lora_A->weight) * scaling);
  unregister_module("lora_A");
  unregister_module("lora_B");
  unregister_module("lora_dropout");
  lora_A = nullptr;
  lora_B = nullptr;
  dropout = nullptr;
}

void LoraLinearImpl::SetBaseWeight(const torch::Tensor& w) {
  Require(w.dim() == 2 && w.size(0) == out_features_ && w.size(1) == in_features_, ErrorCode::kInvalidArgument,
          "base weight of shape " + c10::str(w.sizes()) +
              " for a projection of [" + std::to_string(out_features_) + ", " + std::to_string(in_features_) +
              "]: the checkpoint and config.json disagree");
  torch::NoGradGuard no_grad;
  if (frozen_) {
    frozen_ = FrozenWeight::Store(w.to(frozen_device_), format_);
  } else {
    weight.copy_(w);
  }
}

torch::Tensor LoraLinearImpl::DenseWeight(torch::Dtype dtype) const {
  return frozen_ ? frozen_->Dense(dtype) : weight.detach().to(dtype);
}

int64_t LoraLinearImpl::BaseWeightBytes() const {
  return frozen_ ? frozen_->StoredBytes() : weight.numel() * static_cast<int64_t>(weight.element_size());
}

void LoraLinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  MoveFrozen(device);
}

void LoraLinearImpl::MoveFrozen(const torch::Device& device) {
  frozen_device_ = device;
  if (frozen_) frozen_->To(device);
}

void LoraLinearImpl::to(torch::Dtype dtype, bool non_blocking) { torch::nn::Module::to(dtype, non_blocking); }

void LoraLinearImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  MoveFrozen(device);
}

}  // namespace amaq
