// LoRA (Hu et al. 2021) on a linear projection, with PEFT's conventions so that adapters load in
// the Python ecosystem: y = x W^T + b + dropout(x) A^T B^T * (alpha / r), A [r, in] initialised
// as PEFT does (Kaiming-uniform, a = sqrt(5)), B [out, r] zero, so a fresh adapter changes
// nothing. Adding an adapter freezes the base weight and bias; Merge folds B A * scaling into W.
// The base W is held as the BaseWeights format given at construction: fp32 as the parameter
// `weight`; bf16 or nf4 as a FrozenWeight (common/model/frozen_weight.h), `weight` then undefined.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/base_weights.h"
#include "common/model/frozen_weight.h"

namespace amaq {

// The defaults are the programs' (rank 16, alpha 32, every projection): what lora_* keys default to.
struct LoraConfig {
  int64_t rank = 16;
  double alpha = 32.0;
  double dropout = 0.0;
  // PEFT target_modules names: any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj.
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

  bool Targets(const std::string& module) const;
  void Validate() const;  // throws amaq::Error naming the bad field
};

class LoraLinearImpl : public torch::nn::Module {
 public:
  // W starts random (normal, std 0.02), held as `format` from the start.
  LoraLinearImpl(int64_t in_features, int64_t out_features, bool bias, BaseWeights format = BaseWeights::kFp32);

  torch::Tensor forward(const torch::Tensor& x);
  void AddAdapter(const LoraConfig& config);
  void Merge();  // W += (B A) * scaling, then drops the adapter (a compact W becomes a dense fp32 one)
  bool has_adapter() const { return !lora_A.is_empty(); }
  // Replaces W by `w` ([out, in], any floating dtype), stored in this projection's format: a
  // checkpoint streams into compact forms one tensor at a time. kInvalidArgument on a wrong shape.
  void SetBaseWeight(const torch::Tensor& w);
  // W as a dense tensor in `dtype` (a copy for compact forms).
  torch::Tensor DenseWeight(torch::Dtype dtype) const;
  BaseWeights format() const { return format_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  // Bytes of the base weight as held: dense W, or its compact form.
  int64_t BaseWeightBytes() const;

  // Row groups with adapters of their own (a server batching several clients' steps, S-LoRA and
  // Punica's scheme): until ClearRowGroups, rows [starts[g], starts[g+1]) of x's first dimension
  // use A = adapters[g].first and B = adapters[g].second in place of lora_A and lora_B (one base
  // product over every row, then each group's low-rank product over its rows). starts ascend from
  // 0 to x's first dimension; the tensors are used, not copied, so gradients reach them.
  // kInvalidArgument without an adapter or with starts that do not match adapters.
  void SetRowGroups(std::vector<int64_t> starts, std::vector<std::pair<torch::Tensor, torch::Tensor>> adapters);
  void ClearRowGroups();

  // Module::to, and a compact form follows the device (never the dtype).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  torch::Tensor weight, bias;                       // base; weight undefined when compact, bias when absent
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  torch::nn::Dropout dropout{nullptr};
  double scaling = 0;

 private:
  int64_t in_features_, out_features_;
  void MoveFrozen(const torch::Device& device);

  torch::Tensor LowRank(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b);

  BaseWeights format_;
  std::vector<int64_t> group_starts_;  // empty: no row groups
  std::vector<std::pair<torch::Tensor, torch::Tensor>> group_adapters_;
  std::unique_ptr<FrozenWeight> frozen_;  // set unless format_ is fp32
  torch::Device frozen_device_ = torch::kCPU;
};
TORCH_MODULE(LoraLinear);

}  // namespace amaq
