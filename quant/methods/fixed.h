// fixed:<bits>[:tensor|channel|token|group[:<size>]][:grad=...]: every activation affine at one
// width and granularity (default channel; group size 128); the gradient at the same width and
// granularity, or as grad= says.
#pragma once

#include "quant/method.h"

namespace amaq::quant {

MethodRegistration FixedMethod();

}  // namespace amaq::quant
