// BitBudget: the "target average bits" mode of AMAQ. The user gives a budget (say 3.5 bits) and a
// schedule length; the realized average is steered along a schedule from bmax down to the budget:
//
//   desired(step) = bmax                           for step <  warmup
//                 = linear from bmax to target     for warmup <= step < ramp_end
//                 = target                         afterwards
//   ramp_end      = warmup + ramp_fraction * (total_steps - warmup)
//
// While the realized average lies above desired(step) the regularizer is on, and its weight grows
// by `growth` each such step (from the user's beta), so that it eventually outweighs the task loss
// even on the channels that matter most. On or below the schedule the weight is 0: bits stop
// falling and the task loss alone decides whether a channel climbs back; the grown weight is kept
// for the next time the average rises above the schedule. The final average meets the budget to
// within the overshoot of the gate optimizer (tests/amaq_test.cc measures it).
#pragma once

#include <cstdint>

namespace amaq::quant {

struct BitBudgetOptions {
  double target_bits = 4.0;
  int64_t total_steps = 1000;
  int64_t warmup_steps = 0;
  double ramp_fraction = 0.8;  // share of the post-warm-up steps spent descending
  double growth = 1.05;        // per-step growth of the weight while above the schedule
};

class BitBudget {
 public:
  // Throws amaq::Error (kInvalidArgument) when the target is outside [bmin, bmax] or the
  // schedule is empty.
  BitBudget(double bmin, double bmax, double beta, BitBudgetOptions options);

  double DesiredBits(int64_t step) const;
  // The regularizer weight for `step`, given the realized average bits now. Call once per step.
  double NextBeta(int64_t step, double average_bits);
  const BitBudgetOptions& options() const { return options_; }

 private:
  double bmax_;
  double beta_level_;
  BitBudgetOptions options_;
};

}  // namespace amaq::quant
