// RunHistory: what the server's live view (/api/status) shows of each client's runs: for each run,
// a curve of its applied training steps (loss, average bits, codec bytes so far, when), the metric
// the client reported after each evaluation, and the share of its last activation's elements at
// each bit-width. A Join at step 0 of a client whose run already has points (a --fresh run, a new
// run under the same client_id) begins a new run; the one before is kept as an earlier run, at
// most kEarlierRunsKept of them, oldest dropped first. A curve keeps at most kMaxPoints points over
// the whole run: when full, every other point goes and from then on only every other step is kept
// (the shape of the run stays, the memory a client costs is bounded). Thread-safe; SplitServer
// owns one.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace amaq::server {

class RunHistory {
 public:
  static constexpr size_t kMaxPoints = 512;
  static constexpr size_t kEarlierRunsKept = 4;

  struct StepPoint {
    int64_t step = 0;          // steps done after it (its step id + 1), as evaluations count
    double seconds = 0;        // since the server started
    double loss = 0;
    double average_bits = 0;
    uint64_t bytes_up = 0;     // codec bytes received from this client so far
    uint64_t bytes_down = 0;   // codec bytes sent to it so far
  };
  struct MetricPoint {
    int64_t step = 0;
    double seconds = 0;
    double value = 0;
  };
  struct Run {
    std::string identity;                // the Join's run (docs/protocol.md, "Runs"); empty: not joined
    double started = 0;                  // seconds since the server started, at its first Join
    std::vector<StepPoint> steps;
    std::vector<MetricPoint> metrics;
    std::string metric_name;
    std::map<int, double> width_shares;  // of the last activation
    int64_t stride = 1;                  // steps per kept point
    int64_t offered = 0;                 // steps recorded, kept or not
  };
  struct Client {
    Run run;                  // the current run
    std::deque<Run> earlier;  // oldest first
  };

  // A Join of `client` for its run `identity` that found `steps_done` steps applied, at `seconds`.
  void RecordJoin(const std::string& client, const std::string& identity, int64_t steps_done, double seconds);
  void RecordStep(const std::string& client, const StepPoint& point, const std::map<int, double>& width_shares);
  void RecordMetric(const std::string& client, MetricPoint point, const std::string& name);
  std::map<std::string, Client> Snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Client> clients_;
};

}  // namespace amaq::server
