// How a part holds its frozen base weights (docs/model.md, "Storage of the base weights"):
//
//   fp32  every base tensor dense in the part's dtype (the default; what training computes in)
//   bf16  the seven projections of every layer, the embedding and the LM head as bfloat16
//   nf4   the projections as NF4 (common/model/nf4.h, ~4.13 bits a weight), the embedding and head as bf16
//   int8  the projections as 8-bit codes with a scale per row (int8_weight.h), embedding and head bf16
//
// Norm weights and biases stay dense, LoRA A/B stay in the part's dtype and are the only
// trainable tensors. Compact forms are rebuilt in the compute dtype inside each product
// (common/model/frozen_weight.h). Both sides of a split put the format into the model fingerprint.
#pragma once

#include <string>

namespace amaq {

enum class BaseWeights { kFp32, kBf16, kNf4, kInt8 };

// "fp32" | "bf16" | "nf4" | "int8"; amaq::Error kInvalidArgument naming the accepted values otherwise.
BaseWeights ParseBaseWeights(const std::string& text);
std::string ToString(BaseWeights format);

}  // namespace amaq
