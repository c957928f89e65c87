#include "common/model/recompute.h"

namespace amaq {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class RecomputedLayerFunction : public torch::autograd::Function<RecomputedLayerFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, DecoderLayerImpl* layer,
                               const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& mask) {
    ctx->save_for_backward({x, cos, sin, mask});
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    torch::NoGradGuard no_grad;
    return layer->forward(x, Rotary{cos, sin}, mask);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      y = layer->forward(x, Rotary{saved[1], saved[2]}, saved[3]);
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ForwardRecomputed(DecoderLayerImpl& layer, const torch::Tensor& x, const Rotary& rotary,
                                const torch::Tensor& mask) {
  const torch::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return RecomputedLayerFunction::apply(input, &layer, rotary.cos, rotary.sin, mask);
}

}  // namespace amaq
