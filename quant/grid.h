// ScaleGrid: the (zero, step) of every scale group of a tensor, as values exactly representable in
// the scale format that will carry them, so that encoder and decoder dequantize identically.
//
// Every scheme dequantizes as x_hat = zero + code * step, code in [0, MaxCode(scheme, b)].
// Affine:    zero <= min and zero + (2^b - 1) * step >= max; both zero and step are sent.
// Symmetric: step >= absmax / center with center = 2^(b-1) - 1, and zero = -(center * step)
//            (computed in fp32 by both sides); only step is sent.
// A group whose values are all equal gets step 1 (every code is 0 and decodes exactly).
// Every group decodes each of its codes to a finite value: the encoder refuses a tensor whose grid
// would not (values near fp32's limit at few bits), and the decoder refuses a message that has one,
// with the same text (GroupDecodesFinite, NonFiniteGroupText).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quant/bits_table.h"
#include "quant/scheme.h"

namespace amaq::quant {

struct GridSpec {
  Scheme scheme = Scheme::kAffine;
  Granularity granularity = Granularity::kChannel;
  int group_size = 128;  // used by Granularity::kGroup only
};

struct ScaleGrid {
  ScaleFormat format = ScaleFormat::kFloat16;
  std::vector<float> zeros;  // one per group (derived from steps for symmetric)
  std::vector<float> steps;  // one per group
};

// Number of scale groups of a [rows, cols] tensor.
int64_t ScaleGroupCount(const GridSpec& spec, int64_t rows, int64_t cols);

// Index of the scale group that holds element (row, col).
inline int64_t ScaleGroupOf(const GridSpec& spec, int64_t row, int64_t col, int64_t cols) {
  switch (spec.granularity) {
    case Granularity::kTensor: return 0;
    case Granularity::kChannel: return col;
    case Granularity::kToken: return row;
    case Granularity::kGroup: {
      const int64_t groups_per_row = (cols + spec.group_size - 1) / spec.group_size;
      return row * groups_per_row + col / spec.group_size;
    }
  }
  return 0;
}

// Bit-width of scale group g. ValidateGridSpec guarantees one width per group: per-channel bits
// come with per-channel groups and per-token bits with per-token groups, so g indexes the table.
inline int ScaleGroupBits(const BitsTable& bits, int64_t g) {
  return bits.layout == BitsLayout::kUniform ? bits.bits[0] : bits.bits[static_cast<size_t>(g)];
}

// Whether scale group (zero, step) of `scheme` at `bits` decodes its largest code to a finite value
// (then every code does: x_hat grows with the code).
bool GroupDecodesFinite(Scheme scheme, float zero, float step, int bits);
// What encoder and decoder say of scale group g when GroupDecodesFinite is false.
std::string NonFiniteGroupText(int64_t g, float zero, float step, int bits);

// Throws amaq::Error (kInvalidArgument) unless the scheme is a quantizing one, the granularity and
// group size are valid, and every scale group has one bit-width (per-channel bits need per-channel
// scales, per-token bits per-token scales; symmetric needs >= 2 bits).
void ValidateGridSpec(const GridSpec& spec, const BitsTable& bits, int64_t rows, int64_t cols);

// Throws amaq::Error (kInvalidArgument) naming the first NaN or infinite element of x: as a tensor
// to send (its model diverged) or, with `received`, as a message's decoded float payload.
void RequireFinite(const float* x, int64_t rows, int64_t cols, bool received = false);

// The zero of a symmetric b-bit group with the given step.
inline float SymmetricZero(float step, int bits) {
  return -(static_cast<float>((1 << (bits - 1)) - 1) * step);
}

// Reads x [rows, cols] once and returns its grid. `preferred` is used when every zero and step fits
// it (ScaleFormat::kFloat16 needs magnitudes in [2^-14, 65504] or 0); otherwise fp32. Throws
// amaq::Error (kInvalidArgument) naming the first element that is NaN or infinite.
ScaleGrid ComputeGrid(const float* x, int64_t rows, int64_t cols, const GridSpec& spec,
                      const BitsTable& bits, ScaleFormat preferred);

}  // namespace amaq::quant
