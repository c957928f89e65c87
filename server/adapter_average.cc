#include "server/adapter_average.h"

#include <algorithm>
#include <cmath>

#include "common/base/error.h"

namespace amaq::server {
namespace {

double L2Norm(const NamedFloats& upload) {
  double sum = 0;
  for (const auto& [name, t] : upload) {
    for (float v : t.values) sum += static_cast<double>(v) * v;
  }
  return std::sqrt(sum);
}

// The factor each upload is scaled by: 1, or bound / norm for an upload above the bound.
std::vector<double> NormScales(const std::vector<const NamedFloats*>& uploads, double norm_bound) {
  std::vector<double> scales(uploads.size(), 1.0);
  if (norm_bound <= 0) return scales;
  std::vector<double> norms;
  for (const NamedFloats* u : uploads) norms.push_back(L2Norm(*u));
  std::vector<double> sorted = norms;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2), sorted.end());
  const double bound = norm_bound * sorted[sorted.size() / 2];
  for (size_t i = 0; i < norms.size(); ++i) {
    if (norms[i] > bound && norms[i] > 0) scales[i] = bound / norms[i];
  }
  return scales;
}

// The aggregate of `values` (one per upload) by the rule.
double Aggregate(std::vector<double>& values, const AverageOptions& options) {
  const size_t n = values.size();
  size_t drop = 0;
  if (options.rule == "median") {
    std::sort(values.begin(), values.end());
    return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  }
  if (options.rule == "trimmed_mean") {
    drop = static_cast<size_t>(std::floor(options.trim * static_cast<double>(n)));
    if (drop > 0) std::sort(values.begin(), values.end());
  }
  double sum = 0;
  for (size_t i = drop; i < n - drop; ++i) sum += values[i];
  return sum / static_cast<double>(n - 2 * drop);
}

}  // namespace

NamedFloats AggregateAdapters(const std::vector<const NamedFloats*>& uploads, const NamedFloats& like,
                            const AverageOptions& options) {
  Require(!uploads.empty(), ErrorCode::kInternal, "AggregateAdapters needs at least one upload");
  Require(options.rule == "mean" || options.rule == "trimmed_mean" || options.rule == "median", ErrorCode::kInvalidArgument,
          "adapter_average must be mean, trimmed_mean or median, got '" + options.rule + "'");
  Require(options.trim >= 0 && options.trim < 0.5, ErrorCode::kInvalidArgument,
          "adapter_trim must be in [0, 0.5), got " + std::to_string(options.trim));
  const std::vector<double> scales = NormScales(uploads, options.norm_bound);
  NamedFloats average;
  std::vector<double> values;
  for (const auto& [name, mine] : like) {
    std::vector<std::pair<const std::vector<float>*, double>> present;
    for (size_t u = 0; u < uploads.size(); ++u) {
      const auto it = uploads[u]->find(name);
      if (it != uploads[u]->end() && it->second.values.size() == mine.values.size()) present.emplace_back(&it->second.values, scales[u]);
    }
    NamedFloat out{mine.shape, std::vector<float>(mine.values.size(), 0.0f)};
    for (size_t i = 0; i < out.values.size() && !present.empty(); ++i) {
      values.clear();
      for (const auto& [v, scale] : present) values.push_back((*v)[i] * scale);
      out.values[i] = static_cast<float>(Aggregate(values, options));
    }
    average.emplace(name, std::move(out));
  }
  return average;
}

}  // namespace amaq::server
