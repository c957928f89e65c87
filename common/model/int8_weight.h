// Int8Weight: a frozen linear weight W [out, in] held as 8-bit integers with one fp32 absmax scale
// per output row (the vector-wise quantization of LLM.int8(), without its fp16 outlier columns):
// w ~= code * scale, code = round(w / scale) in [-127, 127], scale = max |w| of the row / 127.
// About 8.03 bits a weight: half of bf16's bytes, twice NF4's, 255 levels a row against NF4's 16
// a block of 64. Rows are rebuilt in the compute dtype inside each product
// (FrozenWeight). The tensors live on the model's device.
#pragma once

#include <torch/torch.h>

#include "common/model/frozen_weight.h"

namespace amaq {

class Int8Weight : public FrozenWeight {
 public:
  // Quantizes `weight` ([out, in], any device, any floating dtype, read as fp32) on its device. A
  // row of zeros keeps scale 0. amaq::Error kInvalidArgument when a weight is NaN or infinite.
  static Int8Weight Quantize(const torch::Tensor& weight);

  // Rows of W as `dtype`: code * its row's scale, computed in fp32 and then cast.
  torch::Tensor DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const override;
  int64_t out_features() const override { return codes_.size(0); }
  int64_t in_features() const override { return codes_.size(1); }
  void To(const torch::Device& device) override;
  // Bytes of the codes and the scales.
  int64_t StoredBytes() const override;

 private:
  torch::Tensor codes_;   // int8 [out, in]
  torch::Tensor scales_;  // float [out, 1]
};

}  // namespace amaq
