// BitBudget: the "target average bits" mode of AMAQ. The user gives a budget (say 3 bits) and the
// run's length; the realized average follows a schedule from bmax down to the budget:
//
//   desired(step) = bmax                           for step <  warmup
//                 = linear from bmax to target     for warmup <= step < ramp_end
//                 = target                         afterwards
//   ramp_end      = warmup + ramp_fraction * (total_steps - warmup)
//
// and every step meets it exactly (to one bit over all channels), by allocation rather than by a
// penalty: the learned gate logits z_i = alpha * q_i all move by one common shift tau, chosen so
// that the integer widths round(bmin + (bmax - bmin) * sigmoid(z_i + tau)) add up to
// round(desired * channels); the bits a rounding leaves over go to the channels closest to their
// next width. The gates decide which channels are wide (their order), the budget how wide on
// average. AllocateBits is that projection; it is deterministic and needs no torch.
#pragma once

#include <cstdint>
#include <vector>

namespace amaq::quant {

struct BitBudgetOptions {
  double target_bits = 4.0;
  int64_t total_steps = 1000;
  int64_t warmup_steps = 0;
  double ramp_fraction = 0.5;  // share of the post-warm-up steps spent descending
};

class BitBudget {
 public:
  // Throws amaq::Error (kInvalidArgument) when the target is outside [bmin, bmax] or the
  // schedule is empty.
  BitBudget(double bmin, double bmax, BitBudgetOptions options);

  double DesiredBits(int64_t step) const;
  const BitBudgetOptions& options() const { return options_; }

 private:
  double bmax_;
  BitBudgetOptions options_;
};

struct BitAllocation {
  std::vector<uint8_t> bits;  // one integer width per gate, in [bmin, bmax]
  double shift = 0;           // tau, added to every logit
};

// Integer widths in [ceil(bmin), floor(bmax)] whose mean is round(average * n) / n (clamped to what
// the range allows), ordered as the logits are: a larger logit never gets fewer bits. Ties go to
// the lower index. Throws amaq::Error (kInvalidArgument) for no logits or a non-finite one.
BitAllocation AllocateBits(const std::vector<float>& logits, double bmin, double bmax, double average);

}  // namespace amaq::quant
