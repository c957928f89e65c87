#include "client/micro_batch_choice.h"

#include <algorithm>
#include <cstdio>

#include "common/base/error.h"
#include "common/base/split_step.h"

namespace amaq::client {

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Parts(int64_t n) { return std::to_string(n) + (n == 1 ? " part" : " parts"); }

}  // namespace

MicroBatchChoice::MicroBatchChoice(int64_t setting, int64_t rows, bool over_network) {
  Require(setting == kAuto || (setting >= 1 && setting <= kMaxMicroBatches), ErrorCode::kInvalidArgument,
          "micro_batches " + std::to_string(setting) + ": give a count from 1 to " + std::to_string(kMaxMicroBatches) +
              ", or auto");
  if (setting != kAuto) {
    candidates_ = {setting};
  } else if (!over_network) {
    candidates_ = {1};
  } else {
    for (int64_t n = 1; n <= std::min<int64_t>(rows, kMaxMicroBatches) && n <= 8; n *= 2) candidates_.push_back(n);
  }
  best_ = candidates_.front();
  chosen_ = candidates_.size() == 1;
}

int64_t MicroBatchChoice::Next() const { return chosen_ ? best_ : candidates_[measured_ % candidates_.size()]; }

void MicroBatchChoice::Took(int64_t parts, double seconds) {
  if (chosen_) return;
  if (!warmed_) {  // the first step pays for first allocations and the connection's warm-up
    warmed_ = true;
    return;
  }
  seconds_[parts].push_back(seconds);
  ++measured_;
  for (int64_t n : candidates_) {
    if (seconds_[n].size() < static_cast<size_t>(kRounds)) return;
  }
  chosen_ = true;
  double least = Median(seconds_[candidates_.front()]);
  for (int64_t n : candidates_) least = std::min(least, Median(seconds_[n]));
  for (int64_t n : candidates_) {  // ascending: the fewest parts within the tolerance of the fastest
    if (Median(seconds_[n]) <= least * (1 + kTolerance)) {
      best_ = n;
      break;
    }
  }
}

void MicroBatchChoice::Remeasure() {
  if (candidates_.size() == 1) return;
  chosen_ = false;
  measured_ = 0;
  warmed_ = false;
  seconds_.clear();
}

std::string MicroBatchChoice::Describe() const {
  std::string text = Parts(Next());
  if (seconds_.empty()) return text;
  text += " (median s/step:";
  for (int64_t n : candidates_) {
    const auto it = seconds_.find(n);
    if (it == seconds_.end() || it->second.empty()) continue;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, " %.3f", Median(it->second));
    text += " " + Parts(n) + seconds + ",";
  }
  text.back() = ')';
  return text;
}

int64_t ParseMicroBatches(const std::string& text) {
  if (text == "auto") return MicroBatchChoice::kAuto;
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  Require(used == text.size() && !text.empty() && n >= 1 && n <= kMaxMicroBatches, ErrorCode::kInvalidArgument,
          "micro_batches is '" + text + "': give auto (the count the link's measured step times favour) or a count from 1 to " +
              std::to_string(kMaxMicroBatches));
  return n;
}

}  // namespace amaq::client
