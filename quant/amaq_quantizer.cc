#include "quant/amaq_quantizer.h"

#include <cmath>
#include <string>

#include "common/base/error.h"
#include "quant/tensor_codec.h"

namespace amaq::quant {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Per-gate integer widths from continuous ones (round half to even, clamped to [1, 8]).
std::vector<uint8_t> RoundBits(const torch::Tensor& continuous_bits) {
  const torch::Tensor rounded =
      continuous_bits.detach().round().clamp(kMinBits, kMaxBits).to(torch::kCPU, torch::kUInt8);
  const uint8_t* p = rounded.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + rounded.numel());
}

// The forward is the wire codec; the backward is the straight-through estimator to x and the LSQ
// step-size gradient to the gates (see amaq.h).
class AmaqFunction : public torch::autograd::Function<AmaqFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& gates, const AmaqQuantizer* quantizer,
                               Encoder* encoder, Encoded* wire) {
    const AmaqOptions& o = quantizer->options();
    const int64_t rows = x.size(0), channels = x.size(1);
    const BitsTable bits = quantizer->IntegerBits(rows);
    torch::Tensor recon;
    Encoded encoded = EncodeTensor(*encoder, x, bits, quantizer->WireOptions(), &recon);
    if (wire) *wire = std::move(encoded);
    const torch::Tensor x_hat = recon.to(x.device(), x.scalar_type());

    // Widths as a broadcastable tensor: [1, channels] or, per token, [rows, 1].
    torch::Tensor widths = torch::from_blob(const_cast<uint8_t*>(bits.bits.data()),
                                            {static_cast<int64_t>(bits.bits.size())}, torch::kUInt8)
                               .to(torch::kFloat)
                               .to(x.device());
    widths = o.per_token ? widths.view({rows, 1}) : widths.view({1, channels});
    // The gates as they are now: the quantizer steps them in place, and a client one step stale
    // does so before this backward runs.
    ctx->save_for_backward({x, x_hat, gates.detach().clone(), widths});
    ctx->saved_data["shift"] = quantizer->shift();
    ctx->saved_data["quantizer"] = reinterpret_cast<int64_t>(quantizer);
    return x_hat;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &x_hat = saved[1], &gates = saved[2], &widths = saved[3];
    const auto* quantizer =
        reinterpret_cast<const AmaqQuantizer*>(ctx->saved_data["quantizer"].toInt());
    const AmaqOptions& o = quantizer->options();
    torch::Tensor grad = grad_outputs[0];
    if (o.quantize_backward) {
      Encoder encoder;
      EncodeOptions encode = quantizer->WireOptions();
      encode.zstd = false;
      torch::Tensor recon;
      EncodeTensor(encoder, grad, quantizer->IntegerBits(x.size(0)), encode, &recon);
      grad = recon.to(grad.device(), grad.scalar_type());
    }

    // d x_hat / d b = -(x_hat - x) * ln2 * 2^b / (2^b - 1), summed per gate.
    const torch::Tensor pow2 = torch::pow(2.0, widths);
    const torch::Tensor per_element =
        -(grad.to(torch::kFloat) * (x_hat - x).to(torch::kFloat)) * (std::log(2.0) * pow2 / (pow2 - 1));
    torch::Tensor grad_bits = o.per_token ? per_element.sum(1) : per_element.sum(0);
    if (o.per_token) {
      // Rows r, r + S, r + 2S, ... share gate r % S.
      grad_bits = grad_bits.view({-1, gates.size(0)}).sum(0);
    }
    const torch::Tensor s = torch::sigmoid(o.alpha * gates.detach() + ctx->saved_data["shift"].toDouble());
    const torch::Tensor grad_gates = grad_bits * ((o.bmax - o.bmin) * o.alpha) * s * (1 - s);
    return {grad, grad_gates.to(gates.scalar_type()), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

void ValidateAmaqOptions(const AmaqOptions& o) {
  Require(o.bmin >= kMinBits && o.bmax <= kMaxBits && o.bmin < o.bmax,
          ErrorCode::kInvalidArgument,
          "AMAQ needs 1 <= bmin < bmax <= 8, got bmin " + std::to_string(o.bmin) + ", bmax " +
              std::to_string(o.bmax) + ": e.g. bmax 8, bmin 3");
  Require(o.alpha > 0 && o.gate_lr > 0 && o.beta >= 0, ErrorCode::kInvalidArgument,
          "AMAQ needs alpha > 0, gate_lr > 0 and beta >= 0 (got alpha " + std::to_string(o.alpha) +
              ", gate_lr " + std::to_string(o.gate_lr) + ", beta " + std::to_string(o.beta) + ")");
  Require(o.initial_fraction > 0 && o.initial_fraction < 1, ErrorCode::kInvalidArgument,
          "initial_fraction is sigmoid(alpha * q0) and must lie in (0, 1), got " +
              std::to_string(o.initial_fraction));
  Require(o.warmup_steps >= 0, ErrorCode::kInvalidArgument, "warmup_steps must be >= 0");
}

AmaqQuantizer::AmaqQuantizer(int64_t gates, AmaqOptions options) : options_(std::move(options)) {
  ValidateAmaqOptions(options_);
  Require(gates > 0, ErrorCode::kInvalidArgument,
          "AMAQ needs at least one gate, got " + std::to_string(gates));
  const double q0 = std::log(options_.initial_fraction / (1 - options_.initial_fraction)) / options_.alpha;
  gates_ = torch::full({gates}, q0, torch::kFloat).set_requires_grad(true);
  optimizer_ = std::make_unique<torch::optim::Adam>(
      std::vector<torch::Tensor>{gates_}, torch::optim::AdamOptions(options_.gate_lr));
  if (options_.budget) budget_.emplace(options_.bmin, options_.bmax, *options_.budget);
  Require(!options_.uniform || budget_, ErrorCode::kInvalidArgument,
          "uniform AMAQ follows a bit budget's schedule: give a budget (amaq:budget=<bits>:uniform)");
  Schedule();
}

torch::Tensor AmaqQuantizer::Quantize(const torch::Tensor& x, Encoder& encoder, Encoded* wire) {
  Require(x.dim() == 2, ErrorCode::kInvalidArgument,
          "AMAQ quantizes [tokens, channels] tensors, got " + std::to_string(x.dim()) +
              " dimensions: flatten batch and sequence first");
  if (options_.per_token) {
    Require(x.size(0) % gates_.size(0) == 0, ErrorCode::kInvalidArgument,
            "per-token AMAQ with " + std::to_string(gates_.size(0)) + " positions got " +
                std::to_string(x.size(0)) + " rows: rows must be whole sequences");
  } else {
    Require(x.size(1) == gates_.size(0), ErrorCode::kInvalidArgument,
            "AMAQ has " + std::to_string(gates_.size(0)) + " channel gates but the tensor has " +
                std::to_string(x.size(1)) + " channels: build the quantizer for the cut's hidden size");
  }
  return AmaqFunction::apply(x, gates_, this, &encoder, wire);
}

EncodeOptions AmaqQuantizer::WireOptions() const {
  EncodeOptions o;
  o.scheme = Scheme::kAffine;
  o.granularity = options_.per_token ? Granularity::kToken : Granularity::kChannel;
  o.scale_format = options_.scale_format;
  o.zstd = options_.zstd;
  return o;
}

torch::Tensor AmaqQuantizer::Logits() const { return options_.alpha * gates_ + shift_; }

torch::Tensor AmaqQuantizer::ContinuousBits() const {
  return options_.bmin + (options_.bmax - options_.bmin) * torch::sigmoid(Logits());
}

std::vector<uint8_t> AmaqQuantizer::GateWidths() const {
  return budget_ ? budget_widths_ : RoundBits(ContinuousBits());
}

BitsTable AmaqQuantizer::IntegerBits(int64_t rows) const {
  std::vector<uint8_t> per_gate = GateWidths();
  if (!options_.per_token) return BitsTable::PerChannel(std::move(per_gate));
  std::vector<uint8_t> per_row(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) per_row[r] = per_gate[static_cast<size_t>(r) % per_gate.size()];
  return BitsTable::PerToken(std::move(per_row));
}

double AmaqQuantizer::AverageBits() const {
  const std::vector<uint8_t> bits = GateWidths();
  double sum = 0;
  for (uint8_t b : bits) sum += b;
  return sum / static_cast<double>(bits.size());
}

torch::Tensor AmaqQuantizer::Regularizer() const {
  return beta_now_ * torch::sigmoid(options_.alpha * gates_).pow(2).mean();
}

void AmaqQuantizer::Schedule() {
  if (!budget_) {
    beta_now_ = step_ < options_.warmup_steps ? 0.0 : options_.beta;
    return;
  }
  beta_now_ = 0;
  const double desired = budget_->DesiredBits(step_);
  // Uniform gates never leave their common start, so their allocation goes by channel index.
  const torch::Tensor z = (options_.alpha * gates_.detach()).to(torch::kCPU, torch::kFloat).contiguous();
  BitAllocation a = AllocateBits(std::vector<float>(z.data_ptr<float>(), z.data_ptr<float>() + z.numel()),
                                 options_.bmin, options_.bmax, desired);
  budget_widths_ = std::move(a.bits);
  shift_ = a.shift;
}

void AmaqQuantizer::set_step(int64_t step) {
  step_ = step;
  Schedule();
}

void AmaqQuantizer::Step() {
  if (!options_.uniform) optimizer_->step();
  optimizer_->zero_grad();
  ++step_;
  Schedule();
}

}  // namespace amaq::quant
