#include "quant/grid.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/base/error.h"
#include "test_tensors.h"

namespace amaq::quant {
namespace {

TEST(Grid, AffineRangeCoversTheData) {
  const int64_t rows = 33, cols = 20;
  const auto x = testing::GaussianTensor(rows, cols, 1);
  for (int b : {1, 3, 8}) {
    const GridSpec spec{Scheme::kAffine, Granularity::kChannel, 0};
    const ScaleGrid grid = ComputeGrid(x.data(), rows, cols, spec, BitsTable::Uniform(b),
                                       ScaleFormat::kFloat16);
    EXPECT_EQ(grid.format, ScaleFormat::kFloat16);
    for (int64_t c = 0; c < cols; ++c) {
      float lo = x[c], hi = x[c];
      for (int64_t r = 0; r < rows; ++r) {
        lo = std::min(lo, x[r * cols + c]);
        hi = std::max(hi, x[r * cols + c]);
      }
      EXPECT_LE(grid.zeros[c], lo);
      EXPECT_GE(grid.zeros[c] + static_cast<float>((1 << b) - 1) * grid.steps[c], hi);
      // Half rounding widens the step by at most a few half ulps.
      EXPECT_LE(grid.steps[c], (hi - lo) / static_cast<float>((1 << b) - 1) * 1.01f + 1e-3f);
    }
  }
}

TEST(Grid, FallsBackToFp32WhenHalfCannotHoldTheScales) {
  std::vector<float> tiny = {1e-7f, 2e-7f, 3e-7f, 4e-7f};  // steps far below half's normal range
  const GridSpec spec{Scheme::kAffine, Granularity::kTensor, 0};
  const ScaleGrid grid = ComputeGrid(tiny.data(), 1, 4, spec, BitsTable::Uniform(4),
                                     ScaleFormat::kFloat16);
  EXPECT_EQ(grid.format, ScaleFormat::kFloat32);
  EXPECT_FLOAT_EQ(grid.zeros[0], 1e-7f);
}

TEST(Grid, ConstantGroupGetsUnitStep) {
  std::vector<float> x(12, 0.5f);
  const GridSpec spec{Scheme::kAffine, Granularity::kToken, 0};
  const ScaleGrid grid = ComputeGrid(x.data(), 3, 4, spec, BitsTable::Uniform(2),
                                     ScaleFormat::kFloat16);
  for (float s : grid.steps) EXPECT_EQ(s, 1.0f);
  for (float z : grid.zeros) EXPECT_EQ(z, 0.5f);
}

TEST(Grid, GroupCounts) {
  EXPECT_EQ(ScaleGroupCount({Scheme::kAffine, Granularity::kTensor, 0}, 10, 300), 1);
  EXPECT_EQ(ScaleGroupCount({Scheme::kAffine, Granularity::kChannel, 0}, 10, 300), 300);
  EXPECT_EQ(ScaleGroupCount({Scheme::kAffine, Granularity::kToken, 0}, 10, 300), 10);
  EXPECT_EQ(ScaleGroupCount({Scheme::kAffine, Granularity::kGroup, 128}, 10, 300), 30);
  EXPECT_EQ(ScaleGroupOf({Scheme::kAffine, Granularity::kGroup, 128}, 2, 260, 300), 8);
}

TEST(Grid, NonFiniteInputNamesTheElement) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, std::nanf(""), 5.0f, 6.0f};
  try {
    ComputeGrid(x.data(), 2, 3, {Scheme::kAffine, Granularity::kChannel, 0}, BitsTable::Uniform(4),
                ScaleFormat::kFloat16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("(1, 0)"), std::string::npos) << e.what();
  }
  x[3] = INFINITY;
  EXPECT_THROW(RequireFinite(x.data(), 2, 3), Error);
}

TEST(Grid, InvalidCombinationsAreRejected) {
  std::vector<float> x(8, 1.0f);
  const auto reject = [&](GridSpec spec, BitsTable bits) {
    EXPECT_THROW(ComputeGrid(x.data(), 2, 4, spec, bits, ScaleFormat::kFloat16), Error);
  };
  reject({Scheme::kSymmetric, Granularity::kChannel, 0}, BitsTable::Uniform(1));
  reject({Scheme::kAffine, Granularity::kTensor, 0}, BitsTable::PerChannel({3, 3, 3, 3}));
  reject({Scheme::kAffine, Granularity::kChannel, 0}, BitsTable::PerToken({3, 3}));
  reject({Scheme::kAffine, Granularity::kGroup, 0}, BitsTable::Uniform(3));
  reject({Scheme::kFloat32, Granularity::kTensor, 0}, BitsTable::Uniform(3));
}

}  // namespace
}  // namespace amaq::quant
