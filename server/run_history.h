// RunHistory: what the server's live view (/api/status) shows of each client's run: a curve of
// its applied training steps (loss, average bits, codec bytes so far, when), the metric the client
// reported after each evaluation, and the share of its last activation's elements at each
// bit-width. A curve keeps at most kMaxPoints points over the whole run: when full, every other
// point goes and from then on only every other step is kept (the shape of the run stays, the
// memory a client costs is bounded). Thread-safe; SplitServer owns one.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace amaq::server {

class RunHistory {
 public:
  static constexpr size_t kMaxPoints = 512;

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
  struct Client {
    std::vector<StepPoint> steps;
    std::vector<MetricPoint> metrics;
    std::string metric_name;
    std::map<int, double> width_shares;  // of the last activation
    int64_t stride = 1;                  // steps per kept point
    int64_t offered = 0;                 // steps recorded, kept or not
  };

  void RecordStep(const std::string& client, const StepPoint& point, const std::map<int, double>& width_shares);
  void RecordMetric(const std::string& client, MetricPoint point, const std::string& name);
  std::map<std::string, Client> Snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Client> clients_;
};

}  // namespace amaq::server
