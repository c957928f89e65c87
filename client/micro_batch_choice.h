// How many parts (micro-batches) a client sends each training step in. A fixed count is used as
// given. `auto` (the default) chooses by measuring:
//   - in one process (no link to overlap with compute) it is 1: whole steps, the fastest there;
//   - over a network it tries the candidate counts (1, 2, 4, 8, up to the batch's rows) in turn,
//     one step each, kRounds times round (interleaved, so that a slow spell of the machine or the
//     link falls on every count alike), after one unmeasured step, and keeps the count whose
//     median step time is least (a count with fewer parts within kTolerance of it wins: fewer
//     parts cost less compute and round less). The trials are made again after the link breaks
//     and the client rejoins, since a new connection may run over another path.
// Steps are measured by their wall time (SplitClient's StepRecord::seconds), which holds the link's
// bytes/s, its latency and both sides' compute as they are now: no model of them to go stale.
// The count changes which rows share a part (and so a part's quantization scales and the order of
// the gradient's sums): a run that must repeat bit for bit names a fixed count.
// Not thread-safe: one client's training loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace amaq::client {

class MicroBatchChoice {
 public:
  static constexpr int64_t kAuto = 0;
  static constexpr int kRounds = 5;
  static constexpr double kTolerance = 0.03;

  // `setting`: a count of at least 1, or kAuto; `rows`: the rows of a step (its batch), the most
  // parts a step can have; `over_network`: whether steps cross a link (auto is 1 when not).
  // Another setting throws amaq::Error (kInvalidArgument).
  MicroBatchChoice(int64_t setting, int64_t rows, bool over_network);

  // The parts the next step goes in.
  int64_t Next() const;
  // A step sent in `parts` (what Next said) took `seconds` of wall time. A step whose link broke
  // is not given: its time is the reconnection's.
  void Took(int64_t parts, double seconds);
  // The link was made again: measure the candidates again (auto over a network only).
  void Remeasure();
  // Whether the trials are over (always, for a fixed count or in one process).
  bool chosen() const { return chosen_; }
  // "4 parts (median s/step: 1 part 0.826, 2 parts 0.467, ...)", for the log once chosen.
  std::string Describe() const;

 private:
  std::vector<int64_t> candidates_;  // one entry: that count, fixed
  bool chosen_ = true;
  size_t measured_ = 0;              // steps measured in this trial: candidates_[measured_ % size] is next
  bool warmed_ = false;              // the unmeasured first step is done
  int64_t best_ = 1;
  std::map<int64_t, std::vector<double>> seconds_;  // each candidate's measured steps
};

// The client key's value: "auto" -> MicroBatchChoice::kAuto, "N" -> N (1 to kMaxMicroBatches);
// anything else throws amaq::Error (kInvalidArgument) saying what is accepted.
int64_t ParseMicroBatches(const std::string& text);

}  // namespace amaq::client
