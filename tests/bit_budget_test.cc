#include "quant/bit_budget.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace amaq::quant {
namespace {

TEST(BitBudget, ScheduleDescendsFromBmaxToTheTarget) {
  const BitBudget budget(3, 8, 0.01, BitBudgetOptions{4.0, 110, 10, 0.5});
  EXPECT_DOUBLE_EQ(budget.DesiredBits(0), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(9), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(10), 8.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(35), 6.0);  // halfway down the 50-step ramp
  EXPECT_DOUBLE_EQ(budget.DesiredBits(60), 4.0);
  EXPECT_DOUBLE_EQ(budget.DesiredBits(109), 4.0);
}

TEST(BitBudget, WeightGrowsAboveTheScheduleAndIsOffBelowIt) {
  BitBudget budget(3, 8, 0.5, BitBudgetOptions{4.0, 100, 0, 1.0, 2.0});
  EXPECT_DOUBLE_EQ(budget.NextBeta(50, 7.0), 1.0);  // desired 6: above, 0.5 * 2
  EXPECT_DOUBLE_EQ(budget.NextBeta(51, 7.0), 2.0);
  EXPECT_DOUBLE_EQ(budget.NextBeta(52, 5.0), 0.0);  // below: off
  EXPECT_DOUBLE_EQ(budget.NextBeta(53, 7.0), 4.0);  // resumes from the grown level
}

TEST(BitBudget, InvalidBudgetsAreRefused) {
  EXPECT_THROW(BitBudget(3, 8, 0.01, BitBudgetOptions{2.5, 100, 0}), Error);
  EXPECT_THROW(BitBudget(3, 8, 0.01, BitBudgetOptions{4, 10, 10}), Error);
  EXPECT_THROW(BitBudget(3, 8, 0.0, BitBudgetOptions{4, 100, 0}), Error);
}

}  // namespace
}  // namespace amaq::quant
