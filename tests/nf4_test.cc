// NF4 storage (common/model/nf4.h): the table against QLoRA's definition, the block and double
// quantization against a reference written here from the definition, error bounds, bad inputs.
#include "common/model/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

// The standard normal's quantile function, by bisection on its CDF.
double NormalQuantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<float> Gaussian(int64_t n, unsigned seed, float stddev = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& x : w) x = normal(rng);
  return w;
}

TEST(Nf4, LevelsAreTheNormalQuantilesOfQLoRA) {
  // QLoRA: 8 positive quantiles at probabilities linspace(offset, 0.5, 9) without the last, 7
  // negative ones at linspace(offset, 0.5, 8) without the last, and zero; divided by the largest.
  const double offset = 0.9677083;
  std::vector<double> want = {0.0};
  for (int i = 0; i < 8; ++i) want.push_back(NormalQuantile(offset + i * (0.5 - offset) / 8));
  for (int i = 0; i < 7; ++i) want.push_back(-NormalQuantile(offset + i * (0.5 - offset) / 7));
  std::sort(want.begin(), want.end());
  const double largest = want.back();
  const auto& levels = Nf4Levels();
  for (size_t i = 0; i < levels.size(); ++i) EXPECT_NEAR(levels[i], want[i] / largest, 2e-6) << "level " << i;
  EXPECT_EQ(levels[7], 0.0f);
  EXPECT_EQ(levels.front(), -1.0f);
  EXPECT_EQ(levels.back(), 1.0f);
}

TEST(Nf4, CodeIsTheNearestLevel) {
  const auto& levels = Nf4Levels();
  for (int k = -2000; k <= 2000; ++k) {
    const float x = static_cast<float>(k) / 2000.0f;
    const uint8_t code = Nf4Code(x);
    ASSERT_LT(code, 16);
    for (const float level : levels) ASSERT_LE(std::fabs(x - levels[code]), std::fabs(x - level)) << "x = " << x;
  }
  for (uint8_t i = 0; i < 16; ++i) EXPECT_EQ(Nf4Code(levels[i]), i);
}

// The definition, written out plainly: what every stored weight must dequantize to.
std::vector<float> ReferenceRoundTrip(const std::vector<float>& w, int64_t block, int64_t scale_block) {
  const auto& levels = Nf4Levels();
  const int64_t blocks = static_cast<int64_t>(w.size()) / block;
  std::vector<float> absmax(static_cast<size_t>(blocks), 0.0f);
  for (size_t i = 0; i < w.size(); ++i) absmax[i / static_cast<size_t>(block)] = std::max(absmax[i / static_cast<size_t>(block)], std::fabs(w[i]));
  double sum = 0;
  for (const float s : absmax) sum += s;
  const float mean = static_cast<float>(sum / static_cast<double>(blocks));
  std::vector<float> scale(static_cast<size_t>(blocks));
  for (int64_t first = 0; first < blocks; first += scale_block) {
    const int64_t last = std::min(blocks, first + scale_block);
    float group_absmax = 0;
    for (int64_t b = first; b < last; ++b) group_absmax = std::max(group_absmax, std::fabs(absmax[b] - mean));
    const float step = group_absmax / 127.0f;
    for (int64_t b = first; b < last; ++b) {
      const float code = step > 0 ? std::nearbyint((absmax[b] - mean) / step) : 0.0f;
      scale[b] = std::max(0.0f, mean + code * step);
    }
  }
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const float s = scale[i / static_cast<size_t>(block)];
    const float x = s > 0 ? std::clamp(w[i] * (1.0f / s), -1.0f, 1.0f) : 0.0f;
    size_t best = 0;
    for (size_t l = 1; l < levels.size(); ++l) {
      if (std::fabs(x - levels[l]) < std::fabs(x - levels[best])) best = l;
    }
    out[i] = levels[best] * s;
  }
  return out;
}

TEST(Nf4, BlocksAndDoubleQuantizationFollowTheDefinition) {
  // 64 * 600 weights: three groups of scales, the last one short; block magnitudes that differ.
  std::vector<float> w = Gaussian(64 * 600, 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= 1.0f + static_cast<float>((i / 64) % 7);
  const Nf4Weights q = Nf4Weights::Quantize(w.data(), static_cast<int64_t>(w.size()));
  EXPECT_EQ(q.blocks(), 600);
  std::vector<float> got(w.size());
  q.Dequantize(got.data());
  EXPECT_EQ(got, ReferenceRoundTrip(w, 64, 256));

  const Nf4Weights small = Nf4Weights::Quantize(w.data(), 64 * 10, {16, 3});
  std::vector<float> small_got(64 * 10);
  small.Dequantize(small_got.data());
  EXPECT_EQ(small_got, ReferenceRoundTrip(std::vector<float>(w.begin(), w.begin() + 64 * 10), 16, 3));
}

TEST(Nf4, StorageIsAboutFourPointOneThreeBitsPerWeight) {
  const int64_t n = 64 * 256 * 4;
  const std::vector<float> w = Gaussian(n, 5);
  const Nf4Weights q = Nf4Weights::Quantize(w.data(), n);
  EXPECT_EQ(q.StoredBytes(), static_cast<size_t>(n / 2 + n / 64 + 4 * 4 + 4));
  const double bits = 8.0 * static_cast<double>(q.StoredBytes()) / static_cast<double>(n);
  EXPECT_GT(bits, 4.12);
  EXPECT_LT(bits, 4.14);
}

TEST(Nf4, RoundTripErrorIsBoundedByHalfTheWidestGapPlusTheScaleError) {
  const auto& levels = Nf4Levels();
  float widest = 0;
  for (size_t i = 0; i + 1 < levels.size(); ++i) widest = std::max(widest, levels[i + 1] - levels[i]);
  std::vector<float> w = Gaussian(64 * 512, 9);
  w[100] = 0.5f;  // an outlier: its block's scale is large, the rest of the block coarse
  const Nf4Weights q = Nf4Weights::Quantize(w.data(), static_cast<int64_t>(w.size()));
  std::vector<float> got(w.size());
  q.Dequantize(got.data());
  for (int64_t b = 0; b < q.blocks(); ++b) {
    float absmax = 0;
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) absmax = std::max(absmax, std::fabs(w[i]));
    const float scale = q.BlockScale(b);
    const float bound = 0.5f * widest * scale + std::fabs(absmax - scale) + 1e-6f * absmax;
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) ASSERT_LE(std::fabs(w[i] - got[i]), bound) << "weight " << i;
  }
}

TEST(Nf4, NormalWeightsLoseLessThanWithAUniformFourBitGrid) {
  // NF4's point: for normally distributed weights its levels beat 16 evenly spaced ones.
  const std::vector<float> w = Gaussian(64 * 1024, 11);
  const Nf4Weights q = Nf4Weights::Quantize(w.data(), static_cast<int64_t>(w.size()));
  std::vector<float> got(w.size());
  q.Dequantize(got.data());
  double nf4 = 0, uniform = 0;
  for (size_t b = 0; b < w.size() / 64; ++b) {
    float absmax = 0;
    for (size_t i = b * 64; i < (b + 1) * 64; ++i) absmax = std::max(absmax, std::fabs(w[i]));
    const float step = 2 * absmax / 15;  // 16 levels from -absmax to absmax
    for (size_t i = b * 64; i < (b + 1) * 64; ++i) {
      const float u = -absmax + step * std::nearbyint((w[i] + absmax) / step);
      uniform += (w[i] - u) * (w[i] - u);
      nf4 += (w[i] - got[i]) * (w[i] - got[i]);
    }
  }
  EXPECT_LT(nf4, 0.9 * uniform);
}

TEST(Nf4, ZeroWeightsStayZero) {
  const std::vector<float> w(128, 0.0f);
  const Nf4Weights q = Nf4Weights::Quantize(w.data(), 128);
  std::vector<float> got(128, 1.0f);
  q.Dequantize(got.data());
  EXPECT_EQ(got, w);
}

ErrorCode CodeOf(const std::vector<float>& w, const Nf4Options& options, std::string* message) {
  try {
    Nf4Weights::Quantize(w.data(), static_cast<int64_t>(w.size()), options);
  } catch (const Error& e) {
    *message = e.what();
    return e.code();
  }
  return ErrorCode::kInternal;  // no error: the caller's expectation fails
}

TEST(Nf4, BadInputsGetClearErrors) {
  std::string message;
  EXPECT_EQ(CodeOf(std::vector<float>(100, 0.1f), {}, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("multiple of the block size 64"), std::string::npos) << message;
  EXPECT_EQ(CodeOf(std::vector<float>(64, 0.1f), {63, 256}, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("even"), std::string::npos) << message;
  EXPECT_EQ(CodeOf(std::vector<float>(64, 0.1f), {64, 0}, &message), ErrorCode::kInvalidArgument);
  std::vector<float> nan(128, 0.1f);
  nan[70] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CodeOf(nan, {}, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("weight 70"), std::string::npos) << message;
  nan[70] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(CodeOf(nan, {}, &message), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace amaq::quant
