// What a quantized tensor is: its numeric scheme, the granularity of its scales, how its
// bit-widths are laid out, and how its scales are stored. These values are written on the wire
// (docs/wire-format.md), so their numbers never change; new values are only ever appended.
//
// Layout: every tensor is a row-major matrix [rows, cols] = [tokens, channels] (batch and sequence
// flattened). Gradients use the same layout.
#pragma once

#include <cstdint>
#include <string>

namespace amaq::quant {

enum class Scheme : uint8_t {
  kFloat32 = 0,    // no compression: raw IEEE fp32
  kBFloat16 = 1,   // cast to bfloat16 (round to nearest even)
  kFloat16 = 2,    // cast to IEEE half (round to nearest even)
  kAffine = 3,     // x ~ zero + code * step, code in [0, 2^b - 1]
  kSymmetric = 4,  // x ~ (code - (2^(b-1) - 1)) * step, code in [0, 2^b - 2]; b >= 2
};

// Which elements share one (zero, step) pair.
enum class Granularity : uint8_t {
  kTensor = 0,   // one pair for the whole tensor
  kChannel = 1,  // one pair per column, over all rows
  kToken = 2,    // one pair per row, over all columns
  kGroup = 3,    // one pair per run of group_size consecutive columns within a row
};

// Which elements share one bit-width.
enum class BitsLayout : uint8_t {
  kUniform = 0,     // one width for the whole tensor
  kPerChannel = 1,  // one width per column (AMAQ's default)
  kPerToken = 2,    // one width per row (AMAQ's per-token variant)
};

enum class ScaleFormat : uint8_t {
  kFloat16 = 0,  // IEEE half: zero rounded down, step rounded up, so the range is still covered
  kFloat32 = 1,  // used automatically when a range does not fit in half
};

enum class Rounding : uint8_t {
  kNearest = 0,     // round half to even; error <= step / 2
  kStochastic = 1,  // floor(u + U[0,1)); unbiased, error < step
};

inline bool IsFloatScheme(Scheme s) {
  return s == Scheme::kFloat32 || s == Scheme::kBFloat16 || s == Scheme::kFloat16;
}

constexpr int kMinBits = 1;
constexpr int kMaxBits = 8;

// Largest code of a b-bit quantizer of the given scheme (the number of steps across the range).
inline int MaxCode(Scheme scheme, int bits) {
  return scheme == Scheme::kSymmetric ? (1 << bits) - 2 : (1 << bits) - 1;
}

std::string ToString(Scheme s);
std::string ToString(Granularity g);
std::string ToString(BitsLayout l);

}  // namespace amaq::quant
