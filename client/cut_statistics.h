// CutStatistics: per-channel statistics of what crosses the cut during training, accumulated over
// steps: the activation's range, mean, variance and excess kurtosis over every token seen, and the
// mean |gradient| that came back. amaq-study relates them to AMAQ's learned widths. Add() takes the
// fp32 activation [rows, channels] a step sent and the gradient [rows, channels] it received.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace amaq::client {

struct ChannelStatistics {
  double min = 0, max = 0, mean = 0, stddev = 0, kurtosis = 0, mean_abs_gradient = 0;
};

class CutStatistics {
 public:
  void Add(const torch::Tensor& activation, const torch::Tensor& gradient);
  // One entry per channel; empty before the first Add.
  std::vector<ChannelStatistics> Channels() const;

 private:
  torch::Tensor count_, sum_, sum2_, sum3_, sum4_, min_, max_, abs_gradient_;  // double, [channels]
};

}  // namespace amaq::client
