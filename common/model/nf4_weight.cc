#include "common/model/nf4_weight.h"

#include <cstring>

namespace amaq {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// y = x W^T, W rebuilt from the codes in forward and again in backward; nothing of W is kept.
class Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const Nf4Weight* weight) {
    ctx->saved_data["weight"] = reinterpret_cast<int64_t>(weight);
    return torch::matmul(x, weight->Dequantize(x.scalar_type()).t());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto* weight = reinterpret_cast<const Nf4Weight*>(ctx->saved_data["weight"].toInt());
    return {torch::matmul(grads[0], weight->Dequantize(grads[0].scalar_type())), torch::Tensor()};
  }
};

template <typename T>
torch::Tensor CpuTensor(const std::vector<T>& values, torch::Dtype dtype) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(values.size())}, dtype);
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace

Nf4Weight Nf4Weight::Quantize(const torch::Tensor& weight, const quant::Nf4Options& options) {
  const torch::Tensor w = weight.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const quant::Nf4Weights q = quant::Nf4Weights::Quantize(w.data_ptr<float>(), w.numel(), options);
  Nf4Weight out;
  out.out_ = weight.size(0);
  out.in_ = weight.size(1);
  out.block_ = q.block();
  out.scale_block_ = q.scale_block();
  out.scale_mean_ = q.scale_mean();
  out.codes_ = CpuTensor(q.codes(), torch::kUInt8);
  out.scale_codes_ = CpuTensor(q.scale_codes(), torch::kInt8);
  out.scale_steps_ = CpuTensor(q.scale_steps(), torch::kFloat);
  const auto& levels = quant::Nf4Levels();
  out.levels_ = CpuTensor(std::vector<float>(levels.begin(), levels.end()), torch::kFloat);
  out.To(weight.device());
  return out;
}

torch::Tensor Nf4Weight::Dequantize(torch::Dtype dtype) const {
  const int64_t blocks = scale_codes_.numel();
  const torch::Tensor steps = scale_steps_.repeat_interleave(scale_block_).slice(0, 0, blocks);
  const torch::Tensor scales = (scale_codes_.to(torch::kFloat) * steps + scale_mean_).clamp_min(0);
  const torch::Tensor index =
      torch::stack({codes_.bitwise_and(15), codes_.bitwise_right_shift(4)}, 1).flatten().to(torch::kLong);
  const torch::Tensor values = levels_.index_select(0, index).view({blocks, block_});
  return (values * scales.unsqueeze(1)).view({out_, in_}).to(dtype);
}

torch::Tensor Nf4Weight::Linear(const torch::Tensor& x) const { return Nf4LinearFunction::apply(x, this); }

void Nf4Weight::To(const torch::Device& device) {
  for (torch::Tensor* t : {&codes_, &scale_codes_, &scale_steps_, &levels_}) *t = t->to(device);
}

int64_t Nf4Weight::StoredBytes() const {
  return codes_.numel() + scale_codes_.numel() + 4 * scale_steps_.numel() + 4;
}

}  // namespace amaq
