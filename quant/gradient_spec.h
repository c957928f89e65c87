// GradientSpec: how a method's gradients go back when its name ends in
//
//   :grad=<bits>[:token][:symmetric][:stochastic]
//
// every element at <bits> (2..8); scales per channel (default) or per token (one per row, so a
// row of tiny gradients keeps its own resolution); an affine grid over [min, max] (default) or a
// symmetric one around 0 (zero is exact, so the many near-zero entries are not pushed off it);
// rounding to the nearest code (default) or stochastic (unbiased: E[decoded] = the gradient).
// A plain value type; docs/study.md measures what each choice does to training.
#pragma once

#include <string>

#include "quant/cut_codec.h"

namespace amaq::quant {

struct GradientSpec {
  int bits = 8;
  Granularity granularity = Granularity::kChannel;
  Scheme scheme = Scheme::kAffine;
  Rounding rounding = Rounding::kNearest;

  // The name's suffix, options in the order above: ":grad=4:token:symmetric".
  std::string ToString() const;
  // The codec options and widths of the gradient messages.
  GradientFormat Format() const;
};

}  // namespace amaq::quant
