#include "common/model/nf4.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/base/error.h"

namespace amaq::quant {

const std::array<float, 16>& Nf4Levels() {
  // QLoRA's table (bitsandbytes' create_normal_map(0.9677083)); tests/nf4_test.cc derives it.
  static const std::array<float, 16> levels = {
      -1.0f,         -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
      -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
      0.07958029955625534f,  0.16093020141124725f,  0.24611230194568634f,  0.33791524171829224f,
      0.44070982933044434f,  0.5626170039176941f,   0.7229568362236023f,   1.0f};
  return levels;
}

uint8_t Nf4Code(float x) {
  // Level i is nearest while x <= the midpoint between levels i and i + 1.
  static const std::array<float, 15> midpoints = [] {
    std::array<float, 15> m{};
    const auto& l = Nf4Levels();
    for (size_t i = 0; i < m.size(); ++i) m[i] = 0.5f * (l[i] + l[i + 1]);
    return m;
  }();
  return static_cast<uint8_t>(std::lower_bound(midpoints.begin(), midpoints.end(), x) - midpoints.begin());
}

Nf4Weights Nf4Weights::Quantize(const float* weights, int64_t n, const Nf4Options& options) {
  Require(options.block >= 2 && options.block % 2 == 0, ErrorCode::kInvalidArgument,
          "nf4: block size must be even and >= 2, got " + std::to_string(options.block) + ": use 64 (QLoRA's)");
  Require(options.scale_block >= 1, ErrorCode::kInvalidArgument,
          "nf4: scale block must be >= 1, got " + std::to_string(options.scale_block) + ": use 256 (QLoRA's)");
  Require(n > 0 && n % options.block == 0, ErrorCode::kInvalidArgument,
          "nf4: " + std::to_string(n) + " weights are not a positive multiple of the block size " +
              std::to_string(options.block) + ": keep such a tensor in fp32/bf16 or choose a block size that divides it");
  for (int64_t i = 0; i < n; ++i) {
    // Not Require: its message would be built for every weight (two numbers formatted each, most
    // of a model's NF4 load time).
    if (!std::isfinite(weights[i])) {
      throw Error(ErrorCode::kInvalidArgument, "nf4: weight " + std::to_string(i) + " is " + std::to_string(weights[i]) +
                                                   ": the checkpoint holds a NaN or infinite weight; check how it was written");
    }
  }

  Nf4Weights q;
  q.numel_ = n;
  q.block_ = options.block;
  q.scale_block_ = options.scale_block;
  const int64_t blocks = n / options.block;

  // First level: one absmax per block.
  std::vector<float> scales(static_cast<size_t>(blocks));
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    float absmax = 0;
    for (int64_t i = b * options.block; i < (b + 1) * options.block; ++i) absmax = std::max(absmax, std::fabs(weights[i]));
    scales[static_cast<size_t>(b)] = absmax;
    sum += absmax;
  }

  // Second level: the scales less their mean, 8 bits per scale, one step per group.
  q.scale_mean_ = static_cast<float>(sum / static_cast<double>(blocks));
  const int64_t groups = (blocks + options.scale_block - 1) / options.scale_block;
  q.scale_steps_.resize(static_cast<size_t>(groups));
  q.scale_codes_.resize(static_cast<size_t>(blocks));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * options.scale_block, last = std::min(blocks, first + options.scale_block);
    float absmax = 0;
    for (int64_t b = first; b < last; ++b) absmax = std::max(absmax, std::fabs(scales[static_cast<size_t>(b)] - q.scale_mean_));
    const float step = absmax / 127.0f;
    q.scale_steps_[static_cast<size_t>(g)] = step;
    for (int64_t b = first; b < last; ++b) {
      const float code = step > 0 ? std::nearbyint((scales[static_cast<size_t>(b)] - q.scale_mean_) / step) : 0.0f;
      q.scale_codes_[static_cast<size_t>(b)] = static_cast<int8_t>(std::clamp(code, -127.0f, 127.0f));
    }
  }

  // The weights' codes, against the scale the reader will use (the dequantized one), so that a
  // block's largest weight still maps inside [-1, 1] up to the scale's rounding.
  q.codes_.assign(static_cast<size_t>(n / 2), 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const float scale = q.BlockScale(b);
    const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
    for (int64_t i = b * options.block; i < (b + 1) * options.block; ++i) {
      const uint8_t code = Nf4Code(std::clamp(weights[i] * inverse, -1.0f, 1.0f));
      q.codes_[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(code << (4 * (i % 2)));
    }
  }
  return q;
}

float Nf4Weights::BlockScale(int64_t b) const {
  const float step = scale_steps_[static_cast<size_t>(b / scale_block_)];
  return std::max(0.0f, scale_mean_ + static_cast<float>(scale_codes_[static_cast<size_t>(b)]) * step);
}

void Nf4Weights::Dequantize(float* out) const {
  const auto& levels = Nf4Levels();
  for (int64_t b = 0; b < blocks(); ++b) {
    const float scale = BlockScale(b);
    for (int64_t i = b * block_; i < (b + 1) * block_; ++i) {
      out[i] = levels[(codes_[static_cast<size_t>(i / 2)] >> (4 * (i % 2))) & 0xF] * scale;
    }
  }
}

size_t Nf4Weights::StoredBytes() const {
  return codes_.size() + scale_codes_.size() + scale_steps_.size() * sizeof(float) + sizeof(scale_mean_);
}

}  // namespace amaq::quant
