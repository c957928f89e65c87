#include "client/cut_statistics.h"

#include "common/base/error.h"

namespace amaq::client {

void CutStatistics::Add(const torch::Tensor& activation, const torch::Tensor& gradient) {
  const torch::Tensor x = activation.detach().to(torch::kCPU, torch::kDouble);
  const torch::Tensor g = gradient.detach().to(torch::kCPU, torch::kDouble);
  Require(x.dim() == 2 && x.sizes() == g.sizes(), ErrorCode::kInvalidArgument,
          "cut statistics need an activation and a gradient of the same [rows, channels] shape");
  if (!sum_.defined()) {
    const int64_t channels = x.size(1);
    count_ = torch::zeros({1}, torch::kDouble);
    sum_ = torch::zeros({channels}, torch::kDouble);
    sum2_ = torch::zeros_like(sum_), sum3_ = torch::zeros_like(sum_), sum4_ = torch::zeros_like(sum_);
    abs_gradient_ = torch::zeros_like(sum_);
    min_ = std::get<0>(x.min(0));
    max_ = std::get<0>(x.max(0));
  }
  Require(x.size(1) == sum_.size(0), ErrorCode::kInvalidArgument, "cut statistics: the channel count changed");
  count_ += x.size(0);
  sum_ += x.sum(0);
  sum2_ += x.pow(2).sum(0);
  sum3_ += x.pow(3).sum(0);
  sum4_ += x.pow(4).sum(0);
  abs_gradient_ += g.abs().sum(0);
  min_ = torch::minimum(min_, std::get<0>(x.min(0)));
  max_ = torch::maximum(max_, std::get<0>(x.max(0)));
}

std::vector<ChannelStatistics> CutStatistics::Channels() const {
  if (!sum_.defined()) return {};
  const double n = count_.item<double>();
  const torch::Tensor mean = sum_ / n;
  // Central moments from the raw ones.
  const torch::Tensor m2 = sum2_ / n - mean.pow(2);
  const torch::Tensor m4 = sum4_ / n - 4 * mean * sum3_ / n + 6 * mean.pow(2) * sum2_ / n - 3 * mean.pow(4);
  const torch::Tensor kurtosis = m4 / m2.pow(2).clamp_min(1e-300) - 3;
  std::vector<ChannelStatistics> out(static_cast<size_t>(sum_.size(0)));
  for (int64_t c = 0; c < sum_.size(0); ++c) {
    ChannelStatistics& s = out[static_cast<size_t>(c)];
    s.min = min_[c].item<double>();
    s.max = max_[c].item<double>();
    s.mean = mean[c].item<double>();
    s.stddev = std::sqrt(std::max(0.0, m2[c].item<double>()));
    s.kurtosis = kurtosis[c].item<double>();
    s.mean_abs_gradient = abs_gradient_[c].item<double>() / n;
  }
  return out;
}

}  // namespace amaq::client
