// amaq[:<bmax>-><bmin>] | amaq[:<bmax>-><bmin>]:budget=<bits>[:uniform], each optionally :grad=... (gradient_spec.h): AMAQ
// (quant/amaq_quantizer.h), learned per-channel widths on the client; the gradient goes back with the
// activation's own widths and granularity, or as grad= says.
#pragma once

#include "quant/method.h"

namespace amaq::quant {

MethodRegistration AmaqMethod();

}  // namespace amaq::quant
