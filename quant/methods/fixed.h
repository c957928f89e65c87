// fixed:<bits>[:tensor|channel|token|group[:<size>]][:grad=...]: every activation affine at one
// width and granularity (default channel; group size 128); the gradient at the same width and
// granularity, or as grad= says.
#pragma once

#include <memory>

#include "quant/method.h"

namespace amaq::quant {

std::unique_ptr<Method> ParseFixed(const MethodName& name);

}  // namespace amaq::quant
