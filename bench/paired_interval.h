// The mean of paired differences (one per seed) and the half-width of its 95% Student t interval,
// as the benchmarks that compare two settings over seeds print them (NaN half-width for one seed).
#pragma once

#include <boost/math/distributions/students_t.hpp>

#include <cmath>
#include <numeric>
#include <vector>

namespace amaq::bench {

struct PairedInterval {
  double mean, half;
};

inline PairedInterval PairedDifference(const std::vector<double>& differences) {
  const double n = static_cast<double>(differences.size());
  const double mean = std::accumulate(differences.begin(), differences.end(), 0.0) / n;
  double ss = 0;
  for (double d : differences) ss += (d - mean) * (d - mean);
  const double half = differences.size() > 1
                          ? boost::math::quantile(boost::math::students_t(n - 1), 0.975) * std::sqrt(ss / (n - 1) / n)
                          : NAN;
  return {mean, half};
}

}  // namespace amaq::bench
