#include "common/base/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace amaq::quant {
namespace {

TEST(Half, ExactValuesRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, -65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(5.9604644775390625e-08f), 0x0001);  // smallest subnormal
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(Half, NearestEvenTies) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToHalf(1.0f + 0.00048828125f), 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0.00048828125f), 0x3c02);
}

TEST(Half, DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-20.0f, 15.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = (i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    const float down = HalfToFloat(FloatToHalf(v, RoundDirection::kDown));
    const float up = HalfToFloat(FloatToHalf(v, RoundDirection::kUp));
    const float nearest = HalfToFloat(FloatToHalf(v));
    ASSERT_LE(down, v) << v;
    ASSERT_GE(up, v) << v;
    ASSERT_TRUE(nearest == down || nearest == up) << v;
    ASSERT_LE(std::fabs(nearest - v), (up - down) / 2 + 0.0f) << v;
  }
}

TEST(Half, DirectedRoundingAcrossZeroAndSubnormals) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1e-9f, RoundDirection::kUp)), 5.9604644775390625e-08f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(1e-9f, RoundDirection::kDown)), 0.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(-1e-9f, RoundDirection::kDown)), -5.9604644775390625e-08f);
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  float v;
  uint32_t bits = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81: to even (0x3f80)
  std::memcpy(&v, &bits, 4);
  EXPECT_EQ(FloatToBFloat16(v), 0x3f80);
  bits = 0x3f818000;  // halfway between 0x3f81 and 0x3f82: to even (0x3f82)
  std::memcpy(&v, &bits, 4);
  EXPECT_EQ(FloatToBFloat16(v), 0x3f82);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-3.0f)), -3.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST(Half, FitsHalfNormal) {
  EXPECT_TRUE(FitsHalfNormal(0.0f));
  EXPECT_TRUE(FitsHalfNormal(-1000.0f));
  EXPECT_FALSE(FitsHalfNormal(1e-6f));
  EXPECT_FALSE(FitsHalfNormal(70000.0f));
}

}  // namespace
}  // namespace amaq::quant
