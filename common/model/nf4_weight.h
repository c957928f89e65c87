// Nf4Weight: a frozen linear weight W [out, in] held as NF4 (common/model/nf4.h: 4-bit codes in blocks
// of 64 with double-quantized 8-bit scales, ~4.13 bits a weight) in tensors on the model's
// device. Dense rebuilds W from the codes (FrozenWeight: inside each product, forward and
// backward alike, a block of rows at a time), through a 256-entry table of code pairs so that the
// rebuild's temporaries stay near the size of the rows rebuilt, in the compute dtype. On the CPU,
// fp32 and bf16 rows are written in one pass over the codes instead (common/model/nf4_rows.h).
#pragma once

#include <torch/torch.h>

#include "common/model/frozen_weight.h"
#include "common/model/nf4.h"
#include "common/model/nf4_rows.h"

namespace amaq {

class Nf4Weight : public FrozenWeight {
 public:
  // Quantizes `weight` ([out, in], any device, any floating dtype, read as fp32); the result
  // lies on the weight's device. amaq::Error kInvalidArgument when out * in is not a multiple of
  // the block size or a weight is NaN or infinite.
  static Nf4Weight Quantize(const torch::Tensor& weight, const quant::Nf4Options& options = {});

  // Rows of W as `dtype` on the weight's device: level(code) * its block's scale, exactly the
  // values of quant::Nf4Weights::Dequantize. Only the blocks that hold those rows are rebuilt.
  torch::Tensor DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const override;
  // The same rows by tensor operations on any device (the table of code pairs): DenseRows' path
  // off the CPU and for other dtypes.
  torch::Tensor DenseRowsByTensorOps(int64_t first, int64_t count, torch::Dtype dtype) const;
  // The stored form as nf4_rows.h reads it; valid while this weight lives and stays on the CPU.
  Nf4View View() const;

  // Moves the stored tensors (their dtypes never change: codes stay 4-bit whatever the model's).
  void To(const torch::Device& device) override;

  // Bytes of the stored tensors (the shared code table apart).
  int64_t StoredBytes() const override;
  int64_t out_features() const override { return out_; }
  int64_t in_features() const override { return in_; }

 private:
  torch::Tensor codes_;        // uint8 [out * in / 2], element 2i in the low nibble
  torch::Tensor scale_codes_;  // int8 [blocks]
  torch::Tensor scale_steps_;  // float [groups of scale_block blocks]
  torch::Tensor pair_levels_;  // float [256, 2]: the levels of a code byte's low and high nibble
  float scale_mean_ = 0;
  int64_t out_ = 0, in_ = 0, block_ = 0, scale_block_ = 0;
};

}  // namespace amaq
