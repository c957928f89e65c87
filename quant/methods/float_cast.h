// fp32 | bf16 | fp16 (and `none` for fp32): activations and gradients cross the cut as floats,
// cast to 16 bits or sent as they are.
#pragma once

#include "quant/method.h"

namespace amaq::quant {

MethodRegistration FloatCastMethod();

}  // namespace amaq::quant
