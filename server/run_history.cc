#include "server/run_history.h"

namespace amaq::server {
namespace {

// Keeps every `stride`-th offered point; a full curve drops every other point and doubles the stride.
template <typename Point>
void Append(std::vector<Point>& curve, const Point& point, int64_t& stride, int64_t& offered) {
  if (offered++ % stride != 0) return;
  curve.push_back(point);
  if (curve.size() < RunHistory::kMaxPoints) return;
  std::vector<Point> halved;
  for (size_t i = 0; i < curve.size(); i += 2) halved.push_back(curve[i]);
  curve.swap(halved);
  stride *= 2;
}

}  // namespace

void RunHistory::RecordStep(const std::string& client, const StepPoint& point, const std::map<int, double>& width_shares) {
  std::lock_guard<std::mutex> lock(mutex_);
  Client& c = clients_[client];
  Append(c.steps, point, c.stride, c.offered);
  if (!width_shares.empty()) c.width_shares = width_shares;
}

void RunHistory::RecordMetric(const std::string& client, MetricPoint point, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  Client& c = clients_[client];
  if (c.metric_name != name) c.metrics.clear();  // another metric: another curve
  c.metric_name = name;
  int64_t stride = 1, offered = 0;  // evaluations are few: kept until the curve is full, then halved
  Append(c.metrics, point, stride, offered);
}

std::map<std::string, RunHistory::Client> RunHistory::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clients_;
}

}  // namespace amaq::server
