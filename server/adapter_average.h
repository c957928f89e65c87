// AggregateAdapters: collaborative mode's aggregate of the clients' latest adapter uploads, robust to
// a few clients that upload far from the others (a Byzantine client within the value bounds moved a
// plain mean to 5000 with an upload of all 1e4).
//   1. Norm bound: an upload whose L2 norm (over all its tensors) exceeds `norm_bound` x the median
//      of the uploads' norms is scaled down to that norm (0: no bound).
//   2. Per coordinate: the mean, the median, or the trimmed mean that drops the floor(trim x n)
//      smallest and largest values of the n uploads (n < 1/trim: the plain mean).
// Tensors missing from an upload, or of another size, are left out of that tensor's aggregate.
// Pure: no state, no locking; the caller holds the uploads.
#pragma once

#include <string>
#include <vector>

#include "common/base/split_step.h"

namespace amaq::server {

struct AverageOptions {
  std::string rule = "trimmed_mean";  // mean | trimmed_mean | median
  double trim = 0.2;                  // trimmed_mean: the share dropped at each end, in [0, 0.5)
  double norm_bound = 3;              // x the median upload norm (0: none)
};

// The aggregate, tensor by tensor, for the names and shapes of `like`; `uploads` must not be empty.
NamedFloats AggregateAdapters(const std::vector<const NamedFloats*>& uploads, const NamedFloats& like,
                            const AverageOptions& options);

}  // namespace amaq::server
