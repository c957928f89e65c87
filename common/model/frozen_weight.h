// FrozenWeight: a frozen base weight W [out, in] held in a compact form (bf16; NF4 in
// common/model/nf4_weight.h; int8 in int8_weight.h) on the model's device, and the products that
// use it. W is rebuilt in the compute dtype inside each product, a block of rows at a time (about
// 4 MiB of fp32), and the backward rebuilds it again instead of keeping it, so a part holds
// compact weights through forward and backward alike and never a whole rebuilt W; gradients flow
// to the input only (W is frozen, as under LoRA). The graph of a product refers to its
// FrozenWeight: the weight must outlive backward (a LoraLinear or ModelPart owns it).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "common/model/base_weights.h"

namespace amaq {

class FrozenWeight {
 public:
  virtual ~FrozenWeight() = default;

  // Stores `weight` ([out, in], any device, any floating dtype) as `format` (bf16, nf4, int8) on
  // the weight's device. amaq::Error kInvalidArgument for fp32 (dense weights are plain tensors)
  // and for what the format refuses (NF4: sizes that are not a multiple of its block; NF4 and
  // int8: NaN or infinite weights).
  static std::unique_ptr<FrozenWeight> Store(const torch::Tensor& weight, BaseWeights format);

  // Rows [first, first + count) of W as `dtype`, [count, in], on the weight's device.
  virtual torch::Tensor DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const = 0;
  virtual int64_t out_features() const = 0;
  virtual int64_t in_features() const = 0;
  // W as `dtype`, [out, in], on the weight's device.
  torch::Tensor Dense(torch::Dtype dtype) const { return DenseRows(0, out_features(), dtype); }
  // Rows `ids` of W (an embedding lookup): [ids..., in] as `dtype`.
  virtual torch::Tensor Rows(const torch::Tensor& ids, torch::Dtype dtype) const;
  // Moves the stored tensors; their dtypes never change.
  virtual void To(const torch::Device& device) = 0;
  // Bytes of the stored tensors.
  virtual int64_t StoredBytes() const = 0;

  // x [..., in] -> x W^T [..., out] in x's dtype, W rebuilt `rows_per_block` rows at a time
  // (0: as many as make about 4 MiB of fp32). One block gives exactly matmul(x, Dense().t());
  // more blocks sum the backward's products block by block (fp32 rounding apart, the same).
  torch::Tensor Linear(const torch::Tensor& x, int64_t rows_per_block = 0) const;
};

// W held as bfloat16: half of fp32's bytes; rows and products cast to the compute dtype. A
// contiguous bf16 `weight` is held as it is (shared, not copied): give it a tensor nobody changes.
class Bf16Weight : public FrozenWeight {
 public:
  explicit Bf16Weight(const torch::Tensor& weight);
  torch::Tensor DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const override;
  int64_t out_features() const override { return stored_.size(0); }
  int64_t in_features() const override { return stored_.size(1); }
  torch::Tensor Rows(const torch::Tensor& ids, torch::Dtype dtype) const override;
  void To(const torch::Device& device) override;
  int64_t StoredBytes() const override;

 private:
  torch::Tensor stored_;  // bf16 [out, in]
};

}  // namespace amaq
