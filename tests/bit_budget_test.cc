#include "quant/bit_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

TEST(BitBudget, ScheduleDescendsFromBmaxToTheTarget) {
  const BitBudget budget(3, 8, BitBudgetOptions{4.0, 110, 10, 0.5});
  EXPECT_DOUBLE_EQ(budget.DesiredBits(0), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(9), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(10), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(35), 6.0);  // halfway down the 50-step ramp
  EXPECT_DOUBLE_EQ(budget.DesiredBits(60), 4.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(109), 4.0);
}

TEST(BitBudget, InvalidBudgetsAreRefused) {
  EXPECT_THROW(BitBudget(3, 8, BitBudgetOptions{2.5, 100, 0}), Error);
  EXPECT_THROW(BitBudget(3, 8, BitBudgetOptions{4, 10, 10}), Error);
  EXPECT_THROW(BitBudget(3, 8, BitBudgetOptions{4, 100, 0, 0.0}), Error);
}

std::vector<float> RandomLogits(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> z(n);
  for (float& v : z) v = normal(rng);
  return z;
}

int64_t Sum(const std::vector<uint8_t>& bits) { return std::accumulate(bits.begin(), bits.end(), int64_t{0}); }

TEST(AllocateBits, MeetsTheAverageToOneBitOverAllGates) {
  const std::vector<float> z = RandomLogits(256, 1);
  for (double average : {3.0, 3.3, 4.0, 4.37, 5.5, 7.99, 8.0}) {
    const BitAllocation a = AllocateBits(z, 3, 8, average);
    EXPECT_EQ(Sum(a.bits), std::llround(average * 256)) << average;
    for (uint8_t b : a.bits) {
      EXPECT_GE(b, 3);
      EXPECT_LE(b, 8);
    }
  }
}

TEST(AllocateBits, ALargerLogitNeverGetsFewerBits) {
  const std::vector<float> z = RandomLogits(100, 2);
  const BitAllocation a = AllocateBits(z, 3, 8, 4.6);
  for (size_t i = 0; i < z.size(); ++i) {
    for (size_t j = 0; j < z.size(); ++j) {
      if (z[i] > z[j]) {
        ASSERT_GE(a.bits[i], a.bits[j]) << i << " vs " << j;
      }
    }
  }
}

TEST(AllocateBits, WithoutAConstraintItIsThePlainRoundingShifted) {
  // The allocation is the unconstrained quantizer's rounding at the returned shift, up to the
  // leftover bits: at most as many widths differ as bits were left over.
  const std::vector<float> z = RandomLogits(64, 3);
  const BitAllocation a = AllocateBits(z, 3, 8, 5.0);
  int differ = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double b = 3 + 5 / (1 + std::exp(-(z[i] + a.shift)));
    differ += a.bits[i] != static_cast<uint8_t>(std::nearbyint(b));
  }
  EXPECT_LE(differ, 1);
}

TEST(AllocateBits, EqualLogitsSplitByIndexAndEndsAreClamped) {
  const BitAllocation a = AllocateBits(std::vector<float>(4, 1.f), 3, 8, 7.5);
  EXPECT_EQ(a.bits, (std::vector<uint8_t>{8, 8, 7, 7}));
  EXPECT_EQ(Sum(AllocateBits(std::vector<float>(4, 0.f), 3, 8, 2.0).bits), 12);  // below bmin: all at 3
  EXPECT_EQ(Sum(AllocateBits(std::vector<float>(4, 0.f), 3, 8, 9.0).bits), 32);  // above bmax: all at 8
}

TEST(AllocateBits, BadLogitsAreRefused) {
  EXPECT_THROW(AllocateBits({}, 3, 8, 4), Error);
  EXPECT_THROW(AllocateBits({1.f, std::nanf("")}, 3, 8, 4), Error);
}

}  // namespace
}  // namespace amaq::quant
