// Progress of long work: a one-line bar redrawn in place on a terminal (steps, ETA and whatever
// fields the caller adds), or a plain log line every `log_every_seconds` when output is not a
// terminal (CI logs, files).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace amaq {

class Progress {
 public:
  Progress(std::string label, int64_t total, double log_every_seconds = 10.0);
  // Reports that `done` of `total` units are complete; `fields` is e.g. "loss 3.21  12.4 MB".
  void Update(int64_t done, const std::string& fields);
  // Ends the bar line (terminal) and logs the final state.
  void Finish(const std::string& fields);

 private:
  std::string Line(int64_t done, const std::string& fields) const;
  std::string label_;
  int64_t total_;
  int64_t start_done_ = -1;
  double log_every_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_log_;
};

}  // namespace amaq
