#include "quant/bit_budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

// The width of one gate at shift tau: round half to even, as the unconstrained quantizer rounds.
int WidthAt(float logit, double tau, double bmin, double bmax, int low, int high) {
  const double b = bmin + (bmax - bmin) / (1 + std::exp(-(static_cast<double>(logit) + tau)));
  return std::clamp(static_cast<int>(std::nearbyint(b)), low, high);
}

}  // namespace

BitBudget::BitBudget(double bmin, double bmax, BitBudgetOptions options) : bmax_(bmax), options_(options) {
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
}

double BitBudget::DesiredBits(int64_t step) const {
  if (step < options_.warmup_steps) return bmax_;
  const double ramp = options_.ramp_fraction *
                      static_cast<double>(options_.total_steps - options_.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - options_.warmup_steps) / ramp);
  return bmax_ + (options_.target_bits - bmax_) * progress;
}

BitAllocation AllocateBits(const std::vector<float>& logits, double bmin, double bmax, double average) {
  Require(!logits.empty(), ErrorCode::kInvalidArgument, "a bit allocation needs at least one gate");
  for (float z : logits) {
    Require(std::isfinite(z), ErrorCode::kInvalidArgument,
            "an AMAQ gate is not finite: the gates diverged; lower amaq_gate_lr and restart from a checkpoint");
  }
  const int low = static_cast<int>(std::ceil(bmin)), high = static_cast<int>(std::floor(bmax));
  const int64_t n = static_cast<int64_t>(logits.size());
  const int64_t total = std::clamp<int64_t>(std::llround(average * static_cast<double>(n)), low * n, high * n);
  const auto sum_at = [&](double tau) {
    int64_t s = 0;
    for (float z : logits) s += WidthAt(z, tau, bmin, bmax, low, high);
    return s;
  };
  // The largest shift whose widths stay within the total: the sum is monotone in tau.
  const auto [lo_z, hi_z] = std::minmax_element(logits.begin(), logits.end());
  double below = -static_cast<double>(*hi_z) - 40, above = -static_cast<double>(*lo_z) + 40;
  for (int i = 0; i < 100; ++i) {
    const double mid = (below + above) / 2;
    (sum_at(mid) <= total ? below : above) = mid;
  }
  BitAllocation a;
  a.shift = below;
  a.bits.resize(logits.size());
  int64_t sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    a.bits[i] = static_cast<uint8_t>(WidthAt(logits[i], below, bmin, bmax, low, high));
    sum += a.bits[i];
  }
  // The bits left over go, one each, to the gates nearest their next width at the shift that
  // would add them: the largest logits among those below the top width (ties: lower index).
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const double fx = WidthAt(logits[x], above, bmin, bmax, low, high) - a.bits[x];
    const double fy = WidthAt(logits[y], above, bmin, bmax, low, high) - a.bits[y];
    return fx != fy ? fx > fy : logits[x] > logits[y];
  });
  for (size_t k = 0; k < order.size() && sum < total; ++k) {
    if (a.bits[order[k]] < high) {
      ++a.bits[order[k]];
      ++sum;
    }
  }
  return a;
}

}  // namespace amaq::quant
