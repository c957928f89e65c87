#include "common/model/int8_weight.h"

#include "common/base/error.h"

namespace amaq {

Int8Weight Int8Weight::Quantize(const torch::Tensor& weight) {
  const torch::Tensor w = weight.detach().to(torch::kFloat);
  Require(w.dim() == 2, ErrorCode::kInvalidArgument, "int8 base weights quantize matrices [out, in]: got " + c10::str(w.sizes()));
  Require(torch::isfinite(w).all().item<bool>(), ErrorCode::kInvalidArgument,
          "a base weight is NaN or infinite: check how the checkpoint was written");
  Int8Weight out;
  out.scales_ = w.abs().amax(1, /*keepdim=*/true) / 127;
  const torch::Tensor safe = torch::where(out.scales_ > 0, out.scales_, torch::ones_like(out.scales_));
  out.codes_ = (w / safe).round().clamp(-127, 127).to(torch::kInt8);
  return out;
}

torch::Tensor Int8Weight::DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const {
  return (codes_.narrow(0, first, count).to(torch::kFloat) * scales_.narrow(0, first, count)).to(dtype);
}

void Int8Weight::To(const torch::Device& device) {
  codes_ = codes_.to(device);
  scales_ = scales_.to(device);
}

int64_t Int8Weight::StoredBytes() const { return codes_.numel() + 4 * scales_.numel(); }

}  // namespace amaq
