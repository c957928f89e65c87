// Inputs shared by the quant tests: reproducible random tensors with and without outliers.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace amaq::testing {

// Gaussian values with a different mean and spread per column, like activations at a cut.
inline std::vector<float> GaussianTensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t c = 0; c < cols; ++c) {
    const float mean = normal(rng), spread = 0.1f + std::abs(normal(rng));
    for (int64_t r = 0; r < rows; ++r) x[r * cols + c] = mean + spread * normal(rng);
  }
  return x;
}

// Student-t-like heavy tails plus a few huge outliers (as in LLM "massive activations").
inline std::vector<float> HeavyTailedTensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t(2.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = t(rng);
  for (int k = 0; k < 5 && !x.empty(); ++k) x[rng() % x.size()] = (k % 2 ? -1.0f : 1.0f) * 3000.0f;
  return x;
}

}  // namespace amaq::testing
