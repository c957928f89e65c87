// aqsgd:<bits>[:grad=...]: AQ-SGD (quant/aqsgd.h): a sample's first activation in bf16, then
// <bits>-bit deltas against both sides' cache of it; evaluation activations in bf16; gradients
// affine per channel at 8 bits, or as grad= says. Training batches keep one shape (rows are keyed
// by sample). Both sides' caches survive reconnects, and restarts with their checkpoints
// (ClientCodec::SaveHistory).
#pragma once

#include "quant/method.h"

namespace amaq::quant {

MethodRegistration AqsgdMethod();

}  // namespace amaq::quant
