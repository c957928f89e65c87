#include "common/model/frozen_weight.h"

#include <algorithm>

#include "common/base/error.h"
#include "common/model/int8_weight.h"
#include "common/model/nf4_weight.h"

namespace amaq {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kBlockElements = int64_t{1} << 20;  // 4 MiB of fp32 rebuilt at a time

// y = x W^T, W rebuilt in blocks of rows in forward and again in backward; nothing of W is kept
// in the graph.
class FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const FrozenWeight* weight,
                               int64_t rows_per_block) {
    ctx->saved_data["weight"] = reinterpret_cast<int64_t>(weight);
    ctx->saved_data["rows_per_block"] = rows_per_block;
    const int64_t out = weight->out_features();
    if (rows_per_block >= out) return torch::matmul(x, weight->Dense(x.scalar_type()).t());
    const torch::Tensor x2 = x.reshape({-1, weight->in_features()});
    torch::Tensor y = torch::empty({x2.size(0), out}, x.options());
    for (int64_t r = 0; r < out; r += rows_per_block) {
      const int64_t n = std::min(rows_per_block, out - r);
      torch::Tensor y_rows = y.narrow(1, r, n);
      torch::mm_out(y_rows, x2, weight->DenseRows(r, n, x.scalar_type()).t());
    }
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    return y.view(shape);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto* weight = reinterpret_cast<const FrozenWeight*>(ctx->saved_data["weight"].toInt());
    const int64_t rows_per_block = ctx->saved_data["rows_per_block"].toInt();
    const torch::Tensor& g = grads[0];
    const int64_t out = weight->out_features();
    if (rows_per_block >= out) return {torch::matmul(g, weight->Dense(g.scalar_type())), torch::Tensor(), torch::Tensor()};
    const torch::Tensor g2 = g.reshape({-1, out});
    torch::Tensor dx = torch::zeros({g2.size(0), weight->in_features()}, g.options());
    for (int64_t r = 0; r < out; r += rows_per_block) {
      const int64_t n = std::min(rows_per_block, out - r);
      dx.addmm_(g2.narrow(1, r, n), weight->DenseRows(r, n, g.scalar_type()));
    }
    std::vector<int64_t> shape = g.sizes().vec();
    shape.back() = weight->in_features();
    return {dx.view(shape), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::unique_ptr<FrozenWeight> FrozenWeight::Store(const torch::Tensor& weight, BaseWeights format) {
  switch (format) {
    case BaseWeights::kBf16: return std::make_unique<Bf16Weight>(weight);
    case BaseWeights::kNf4: return std::make_unique<Nf4Weight>(Nf4Weight::Quantize(weight));
    case BaseWeights::kInt8: return std::make_unique<Int8Weight>(Int8Weight::Quantize(weight));
    case BaseWeights::kFp32: break;
  }
  throw Error(ErrorCode::kInvalidArgument, "fp32 base weights are held dense: FrozenWeight stores bf16, nf4 or int8");
}

torch::Tensor FrozenWeight::Rows(const torch::Tensor& ids, torch::Dtype dtype) const {
  return torch::embedding(Dense(dtype), ids);
}

torch::Tensor FrozenWeight::Linear(const torch::Tensor& x, int64_t rows_per_block) const {
  if (rows_per_block <= 0) rows_per_block = std::max<int64_t>(1, kBlockElements / in_features());
  return FrozenLinearFunction::apply(x, this, rows_per_block);
}

Bf16Weight::Bf16Weight(const torch::Tensor& weight)
    : stored_(weight.detach().to(torch::kBFloat16).contiguous()) {}

torch::Tensor Bf16Weight::DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const {
  return stored_.narrow(0, first, count).to(dtype);
}

torch::Tensor Bf16Weight::Rows(const torch::Tensor& ids, torch::Dtype dtype) const {
  return torch::embedding(stored_, ids).to(dtype);
}

void Bf16Weight::To(const torch::Device& device) { stored_ = stored_.to(device); }

int64_t Bf16Weight::StoredBytes() const { return stored_.numel() * 2; }

}  // namespace amaq
