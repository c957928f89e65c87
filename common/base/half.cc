#include "common/base/half.h"

#include <cmath>
#include <cstring>

namespace amaq::quant {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t FloatToHalfNearestEven(float value) {
  uint32_t x = FloatBits(value);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below half's smallest normal (2^-14): the result is a subnormal m * 2^-24. Scaling by 2^24
    // is exact, and nearbyint rounds half to even in the default rounding mode.
    const auto m = static_cast<uint32_t>(std::nearbyint(BitsFloat(x) * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  x += 0xfffu + ((x >> 13) & 1u);  // round to nearest even at the 13th mantissa bit
  x -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (x >> 13));
}

// The next half towards -inf (down) or +inf (up); infinities and NaN are returned unchanged.
uint16_t NextHalf(uint16_t h, bool up) {
  if ((h & 0x7c00u) == 0x7c00u) return h;
  const bool negative = (h & 0x8000u) != 0;
  if ((h & 0x7fffu) == 0) return up ? 0x0001u : 0x8001u;  // +-0 -> smallest subnormal
  // Moving away from zero increments the magnitude; towards zero decrements it.
  const bool away = (up != negative);
  return static_cast<uint16_t>(away ? h + 1 : h - 1);
}

}  // namespace

uint16_t FloatToHalf(float value, RoundDirection direction) {
  uint16_t h = FloatToHalfNearestEven(value);
  if (direction == RoundDirection::kNearestEven || std::isnan(value)) return h;
  const float back = HalfToFloat(h);
  if (direction == RoundDirection::kDown && back > value) h = NextHalf(h, /*up=*/false);
  if (direction == RoundDirection::kUp && back < value) h = NextHalf(h, /*up=*/true);
  return h;
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t x = FloatBits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float BFloat16ToFloat(uint16_t bf16) { return BitsFloat(static_cast<uint32_t>(bf16) << 16); }

bool FitsHalfNormal(float value) {
  const float magnitude = std::fabs(value);
  return magnitude == 0.0f || (magnitude >= 6.103515625e-05f && magnitude <= 65504.0f);
}

}  // namespace amaq::quant
