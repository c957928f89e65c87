#include "common/model/compute_dtype.h"

#include "common/base/error.h"

namespace amaq {

bool ComputesBf16Natively(const torch::Device& device) {
  if (device.is_cuda()) return true;
#if defined(__x86_64__)
  return device.is_cpu() && (__builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16"));
#else
  return false;
#endif
}

torch::Dtype ParseComputeDtype(const std::string& text, const torch::Device& device) {
  if (text == "fp32") return torch::kFloat;
  if (text == "bf16") return torch::kBFloat16;
  if (text == "auto") return ComputesBf16Natively(device) ? torch::kBFloat16 : torch::kFloat;
  throw Error(ErrorCode::kInvalidArgument, "compute_dtype must be fp32, bf16 or auto, got '" + text + "'");
}

std::string ComputeDtypeName(torch::Dtype dtype) {
  if (dtype == torch::kFloat) return "fp32";
  if (dtype == torch::kBFloat16) return "bf16";
  throw Error(ErrorCode::kInvalidArgument, std::string("no compute_dtype names ") + c10::toString(dtype) +
                                               ": use fp32 or bf16");
}

}  // namespace amaq
