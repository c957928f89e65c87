#include "quant/scheme.h"

namespace amaq::quant {

std::string ToString(Scheme s) {
  switch (s) {
    case Scheme::kFloat32: return "fp32";
    case Scheme::kBFloat16: return "bf16";
    case Scheme::kFloat16: return "fp16";
    case Scheme::kAffine: return "affine";
    case Scheme::kSymmetric: return "symmetric";
  }
  return "scheme(" + std::to_string(static_cast<int>(s)) + ")";
}

std::string ToString(Granularity g) {
  switch (g) {
    case Granularity::kTensor: return "per-tensor";
    case Granularity::kChannel: return "per-channel";
    case Granularity::kToken: return "per-token";
    case Granularity::kGroup: return "group";
  }
  return "granularity(" + std::to_string(static_cast<int>(g)) + ")";
}

std::string ToString(BitsLayout l) {
  switch (l) {
    case BitsLayout::kUniform: return "uniform";
    case BitsLayout::kPerChannel: return "per-channel";
    case BitsLayout::kPerToken: return "per-token";
  }
  return "bits-layout(" + std::to_string(static_cast<int>(l)) + ")";
}

}  // namespace amaq::quant
