// AMAQ: Adaptive Mixed-bit Activation Quantization (arXiv 2510.05468), the client side of a cut.
//
// Every channel (or, per-token, every sequence position) has a learned gate q. Its bit-width is
//   b_cont = bmin + (bmax - bmin) * sigmoid(alpha * q),   b = round(b_cont)  (straight-through)
// and the channel is quantized per channel, affine, over the message's own min/max with 2^b - 1
// steps, exactly as the wire codec sends it. Gradients (docs/amaq.md derives them):
//   d/dx = incoming gradient (straight-through; the range is the data's own, so nothing clips)
//   d/dq = sum over the channel of g * dx_hat/dstep * dstep/db * db/dq   (LSQ through the step)
//        = -sum g * (x_hat - x) * ln2 * 2^b / (2^b - 1) * (bmax - bmin) * alpha * s * (1 - s)
// with s = sigmoid(alpha * q). The regularizer beta * mean(sigmoid(alpha * q)^2) pulls every gate
// down; the task loss keeps the channels that matter wide. Gates start at sigmoid(alpha q0) = 0.97
// (8 bits), train with their own Adam optimizer and learning rate, and the realized average of
// the integer bits actually sent is always available. With a bit budget (quant/bit_budget.h) the
// regularizer is off and every step's widths are allocated to meet the schedule exactly: the
// logits alpha * q all move by one shift tau (s = sigmoid(alpha * q + tau) above), so the gates
// decide which channels are wide and the budget how many bits there are.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>

#include "quant/bit_budget.h"
#include "quant/codec.h"

namespace amaq::quant {

struct AmaqOptions {
  double bmin = 3.0;
  double bmax = 8.0;
  double alpha = 1.0;      // gate sharpness; the gate's effective rate is alpha * gate_lr
  double beta = 0.01;      // regularizer weight (docs/amaq.md: how it was chosen)
  double gate_lr = 0.05;   // Adam learning rate of the gates
  double initial_fraction = 0.97;  // sigmoid(alpha * q0): start at bmax after rounding
  int64_t warmup_steps = 0;        // steps at bmax before the regularizer switches on
  bool per_token = false;          // one gate per sequence position instead of per channel
  bool quantize_backward = false;  // local simulation: quantize the incoming gradient as the
                                   // server would (same integer bits, own scales)
  ScaleFormat scale_format = ScaleFormat::kFloat16;
  bool zstd = false;
  std::optional<BitBudgetOptions> budget;  // target-average mode (replaces beta and warmup_steps)
  bool uniform = false;  // with a budget: no learned allocation, the gates frozen and every gate at
                         // the schedule's width; a fractional average puts the first gates one bit
                         // wider (the control that isolates the annealing, at AMAQ's exact bytes)
};

// Throws amaq::Error (kInvalidArgument) naming the bad option.
void ValidateAmaqOptions(const AmaqOptions& options);

class AmaqQuantizer {
 public:
  // `gates` = channels at the cut (hidden size), or the sequence length when per_token.
  AmaqQuantizer(int64_t gates, AmaqOptions options);

  // Quantizes x [rows, channels] (rows = batch * sequence). Returns x_hat on x's device and dtype,
  // differentiable to x (straight-through) and to the gates. `wire`, when not null, receives the
  // codec message: decoding it yields x_hat bit for bit. `encoder` is the activation stream.
  // x_hat's autograd node points at this quantizer: it must outlive every backward through x_hat.
  torch::Tensor Quantize(const torch::Tensor& x, Encoder& encoder, Encoded* wire = nullptr);

  // The codec options of its messages (affine, per channel or per token).
  EncodeOptions WireOptions() const;
  // alpha * q + tau (tau: the budget's shift, else 0), differentiable in q.
  torch::Tensor Logits() const;
  // bmin + (bmax - bmin) * sigmoid(Logits()), differentiable.
  torch::Tensor ContinuousBits() const;
  // The integer widths for a message of `rows` rows (per-token gates repeat every sequence).
  BitsTable IntegerBits(int64_t rows) const;
  // Mean of the integer widths over the gates: the average bits of every message sent now.
  double AverageBits() const;
  // beta_now * mean(sigmoid(alpha * q)^2), differentiable in q.
  torch::Tensor Regularizer() const;

  // Applies the gate optimizer to the gradients accumulated so far, clears them, and advances
  // the schedule (warm-up, or the bit budget's allocation for the next step).
  void Step();

  torch::Tensor& gates() { return gates_; }
  const AmaqOptions& options() const { return options_; }
  double current_beta() const { return beta_now_; }
  double shift() const { return shift_; }  // tau (0 without a budget)
  int64_t step() const { return step_; }
  // Continues the schedule from `step` (a resumed run).
  void set_step(int64_t step);
  torch::optim::Adam& optimizer() { return *optimizer_; }

 private:
  // Sets beta and, under a budget, the widths and shift for step_.
  void Schedule();
  std::vector<uint8_t> GateWidths() const;

  AmaqOptions options_;
  torch::Tensor gates_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::optional<BitBudget> budget_;
  std::vector<uint8_t> budget_widths_;  // under a budget: this step's allocation
  double shift_ = 0;                    // under a budget: tau
  int64_t step_ = 0;
  double beta_now_ = 0;
};

}  // namespace amaq::quant
