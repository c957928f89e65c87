// NF4: 4-bit NormalFloat storage of frozen base weights, as QLoRA defines it (arXiv 2305.14314,
// section 3), with its double quantization of the scales.
//
// A weight tensor, flattened, is cut into blocks of `block` weights (64). Each block keeps its
// absmax s and every weight w the index of the level of Nf4Levels() nearest to w / s: 4 bits, two
// codes a byte (element 2i in the low nibble). The per-block scales are quantized again
// ("double quantization"): their mean m is kept in fp32, and the differences s - m, in groups of
// `scale_block` scales (256), are stored as signed 8-bit codes of a symmetric grid whose step is
// the group's absmax / 127 (one fp32 absmax per group). That is ~4.13 bits per weight. QLoRA's
// second level uses bitsandbytes' 8-bit dynamic map instead of this linear grid; the first level
// and the table are QLoRA's. Nf4Weights owns its storage and is independent of the input buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace amaq::quant {

// The 16 NF4 levels in ascending order: the quantiles of a standard normal, normalised to
// [-1, 1], with an exact zero (7 negative levels, zero, 8 positive ones).
const std::array<float, 16>& Nf4Levels();

// The index of the level nearest to x (x in [-1, 1]; ties go to the lower level).
uint8_t Nf4Code(float x);

struct Nf4Options {
  int64_t block = 64;         // weights per absmax scale; even, >= 2
  int64_t scale_block = 256;  // scales per 8-bit group of the double quantization; >= 1
};

class Nf4Weights {
 public:
  // Quantizes the n weights at `weights`. amaq::Error kInvalidArgument when n is not a positive
  // multiple of options.block, when the options are out of range, or when a weight is NaN or
  // infinite (the message names its index).
  static Nf4Weights Quantize(const float* weights, int64_t n, const Nf4Options& options = {});

  // Writes the numel() dequantized weights to `out`: level(code) * scale of the weight's block.
  void Dequantize(float* out) const;

  // The dequantized absmax scale of block b (after double quantization).
  float BlockScale(int64_t b) const;

  // The stored form, for holding it elsewhere (a tensor on a GPU): the packed codes, one scale
  // code per block, one step per group of scale_block blocks, and the scales' mean.
  const std::vector<uint8_t>& codes() const { return codes_; }
  const std::vector<int8_t>& scale_codes() const { return scale_codes_; }
  const std::vector<float>& scale_steps() const { return scale_steps_; }
  float scale_mean() const { return scale_mean_; }
  int64_t block() const { return block_; }
  int64_t scale_block() const { return scale_block_; }

  int64_t numel() const { return numel_; }
  int64_t blocks() const { return static_cast<int64_t>(scale_codes_.size()); }
  // Bytes held for the weights: codes, scale codes, group absmaxes and the mean.
  size_t StoredBytes() const;

 private:
  Nf4Weights() = default;

  int64_t numel_ = 0;
  int64_t block_ = 0;
  int64_t scale_block_ = 0;
  std::vector<uint8_t> codes_;        // numel / 2 bytes
  std::vector<int8_t> scale_codes_;   // one per block: round((s - mean) / group step)
  std::vector<float> scale_steps_;    // one per group of scale_block scales: absmax(s - mean) / 127
  float scale_mean_ = 0;
};

}  // namespace amaq::quant
