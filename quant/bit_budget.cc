#include "quant/bit_budget.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace amaq::quant {

BitBudget::BitBudget(double bmin, double bmax, double beta, BitBudgetOptions options)
    : bmax_(bmax), beta_level_(beta), options_(options) {
  Require(options.target_bits >= bmin && options.target_bits <= bmax,
          ErrorCode::kInvalidArgument,
          "target average bits " + std::to_string(options.target_bits) + " is outside [bmin, bmax] = [" +
              std::to_string(bmin) + ", " + std::to_string(bmax) + "]: choose a budget between them");
  Require(options.total_steps > options.warmup_steps && options.warmup_steps >= 0,
          ErrorCode::kInvalidArgument,
          "the bit-budget schedule needs total_steps (" + std::to_string(options.total_steps) +
              ") greater than warmup_steps (" + std::to_string(options.warmup_steps) + ") >= 0");
  Require(options.ramp_fraction > 0 && options.ramp_fraction <= 1, ErrorCode::kInvalidArgument,
          "ramp_fraction must be in (0, 1], got " + std::to_string(options.ramp_fraction));
  Require(options.growth >= 1 && beta > 0, ErrorCode::kInvalidArgument,
          "the bit budget needs beta > 0 and growth >= 1 (got beta " + std::to_string(beta) +
              ", growth " + std::to_string(options.growth) + ")");
}

double BitBudget::DesiredBits(int64_t step) const {
  if (step < options_.warmup_steps) return bmax_;
  const double ramp = options_.ramp_fraction *
                      static_cast<double>(options_.total_steps - options_.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - options_.warmup_steps) / ramp);
  return bmax_ + (options_.target_bits - bmax_) * progress;
}

double BitBudget::NextBeta(int64_t step, double average_bits) {
  if (average_bits <= DesiredBits(step)) return 0.0;
  beta_level_ *= options_.growth;
  return beta_level_;
}

}  // namespace amaq::quant
