#include "common/model/compute_dtype.h"

#include "common/base/error.h"

namespace amaq {

torch::Dtype ParseComputeDtype(const std::string& text) {
  if (text == "fp32") return torch::kFloat;
  if (text == "bf16") return torch::kBFloat16;
  throw Error(ErrorCode::kInvalidArgument, "compute_dtype must be fp32 or bf16, got '" + text + "'");
}

}  // namespace amaq
