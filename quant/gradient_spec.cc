#include "quant/gradient_spec.h"

namespace amaq::quant {

std::string GradientSpec::ToString() const {
  std::string s = ":grad=" + std::to_string(bits);
  if (granularity == Granularity::kToken) s += ":token";
  if (scheme == Scheme::kSymmetric) s += ":symmetric";
  if (rounding == Rounding::kStochastic) s += ":stochastic";
  return s;
}

GradientFormat GradientSpec::Format() const {
  GradientFormat f;
  f.options.scheme = scheme;
  f.options.granularity = granularity;
  f.options.rounding = rounding;
  f.bits = BitsTable::Uniform(bits);
  return f;
}

}  // namespace amaq::quant
