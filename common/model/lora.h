// LoRA (Hu et al. 2021) on a linear projection, with PEFT's conventions so that adapters load in
// the Python ecosystem: y = x W^T + b + dropout(x) A^T B^T * (alpha / r), A [r, in] initialised
// as PEFT does (Kaiming-uniform, a = sqrt(5)), B [out, r] zero, so a fresh adapter changes
// nothing. Adding an adapter freezes the base weight and bias; Merge folds B A * scaling into W.
// StoreAsNf4 replaces W by its NF4 form (common/model/nf4_weight.h): `weight` is then empty and
// the product uses the 4-bit codes; load a checkpoint's weights before, not after.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "common/model/nf4_weight.h"

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
  LoraLinearImpl(int64_t in_features, int64_t out_features, bool bias);

  torch::Tensor forward(const torch::Tensor& x);
  void AddAdapter(const LoraConfig& config);
  void Merge();  // W += (B A) * scaling, then drops the adapter (an NF4 W becomes dense again)
  bool has_adapter() const { return !lora_A.is_empty(); }
  // Quantizes W to NF4 and frees the dense W; it stays frozen.
  void StoreAsNf4(const quant::Nf4Options& options = {});
  bool is_nf4() const { return nf4_.has_value(); }
  // Bytes of the base weight as held: dense W, or its NF4 form.
  int64_t BaseWeightBytes() const;

  // Module::to, and the NF4 form follows the device (never the dtype).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  torch::Tensor weight, bias;                       // base; bias undefined when absent
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  torch::nn::Dropout dropout{nullptr};
  double scaling = 0;

 private:
  int64_t in_features_, out_features_;
  std::optional<Nf4Weight> nf4_;
};
TORCH_MODULE(LoraLinear);

}  // namespace amaq
