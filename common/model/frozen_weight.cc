#include "common/model/frozen_weight.h"

#include "common/base/error.h"
#include "common/model/nf4_weight.h"

namespace amaq {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// y = x W^T, W rebuilt in forward and again in backward; nothing of W is kept in the graph.
class FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const FrozenWeight* weight) {
    ctx->saved_data["weight"] = reinterpret_cast<int64_t>(weight);
    return torch::matmul(x, weight->Dense(x.scalar_type()).t());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto* weight = reinterpret_cast<const FrozenWeight*>(ctx->saved_data["weight"].toInt());
    return {torch::matmul(grads[0], weight->Dense(grads[0].scalar_type())), torch::Tensor()};
  }
};

}  // namespace

std::unique_ptr<FrozenWeight> FrozenWeight::Store(const torch::Tensor& weight, BaseWeights format) {
  switch (format) {
    case BaseWeights::kBf16: return std::make_unique<Bf16Weight>(weight);
    case BaseWeights::kNf4: return std::make_unique<Nf4Weight>(Nf4Weight::Quantize(weight));
    case BaseWeights::kFp32: break;
  }
  throw Error(ErrorCode::kInvalidArgument, "fp32 base weights are held dense: FrozenWeight stores bf16 or nf4");
}

torch::Tensor FrozenWeight::Rows(const torch::Tensor& ids, torch::Dtype dtype) const {
  return torch::embedding(Dense(dtype), ids);
}

torch::Tensor FrozenWeight::Linear(const torch::Tensor& x) const { return FrozenLinearFunction::apply(x, this); }

Bf16Weight::Bf16Weight(const torch::Tensor& weight)
    : stored_(weight.detach().to(torch::kBFloat16).contiguous()) {}

torch::Tensor Bf16Weight::Dense(torch::Dtype dtype) const { return stored_.to(dtype); }

torch::Tensor Bf16Weight::Rows(const torch::Tensor& ids, torch::Dtype dtype) const {
  return torch::embedding(stored_, ids).to(dtype);
}

void Bf16Weight::To(const torch::Device& device) { stored_ = stored_.to(device); }

int64_t Bf16Weight::StoredBytes() const { return stored_.numel() * 2; }

}  // namespace amaq
