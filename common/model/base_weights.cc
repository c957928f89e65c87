#include "common/model/base_weights.h"

#include "common/base/error.h"

namespace amaq {

BaseWeights ParseBaseWeights(const std::string& text) {
  if (text == "fp32") return BaseWeights::kFp32;
  if (text == "bf16") return BaseWeights::kBf16;
  if (text == "nf4") return BaseWeights::kNf4;
  if (text == "int8") return BaseWeights::kInt8;
  throw Error(ErrorCode::kInvalidArgument, "base_weights must be fp32, bf16, nf4 or int8, got '" + text + "'");
}

std::string ToString(BaseWeights format) {
  switch (format) {
    case BaseWeights::kFp32: return "fp32";
    case BaseWeights::kBf16: return "bf16";
    case BaseWeights::kNf4: return "nf4";
    case BaseWeights::kInt8: return "int8";
  }
  return "fp32";
}

}  // namespace amaq
