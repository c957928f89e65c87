// Conversions between fp32 and the 16-bit formats that cross the wire: IEEE half (fp16) and
// bfloat16. Half conversion takes a rounding direction so that a quantizer's range, stored in half,
// still covers the data (zero rounded down, step rounded up). Pure bit manipulation: the results
// are the same on every machine.
#pragma once

#include <cstdint>

namespace amaq::quant {

enum class RoundDirection { kNearestEven, kDown, kUp };

uint16_t FloatToHalf(float value, RoundDirection direction = RoundDirection::kNearestEven);
float HalfToFloat(uint16_t half);

// Round to nearest even; NaN stays NaN.
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bf16);

// True when `value` survives a round trip through half without losing more than half's normal
// precision: it is 0, or its magnitude lies in [2^-14, 65504].
bool FitsHalfNormal(float value);

}  // namespace amaq::quant
