#include "server/run_history.h"

namespace amaq::server {
namespace {

// Appends `point`; a curve that is then full keeps every other point. Returns whether it halved.
template <typename Point>
bool Append(std::vector<Point>& curve, const Point& point) {
  curve.push_back(point);
  if (curve.size() < RunHistory::kMaxPoints) return false;
  std::vector<Point> halved;
  for (size_t i = 0; i < curve.size(); i += 2) halved.push_back(curve[i]);
  curve.swap(halved);
  return true;
}

}  // namespace

void RunHistory::RecordStep(const std::string& client, const StepPoint& point, const std::map<int, double>& width_shares) {
  std::lock_guard<std::mutex> lock(mutex_);
  Client& c = clients_[client];
  if (c.offered++ % c.stride == 0 && Append(c.steps, point)) c.stride *= 2;  // from then on every other step
  if (!width_shares.empty()) c.width_shares = width_shares;
}

void RunHistory::RecordMetric(const std::string& client, MetricPoint point, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  Client& c = clients_[client];
  if (c.metric_name != name) c.metrics.clear();  // another metric: another curve
  c.metric_name = name;
  Append(c.metrics, point);  // evaluations are few: each is kept until the curve is full
}

std::map<std::string, RunHistory::Client> RunHistory::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clients_;
}

}  // namespace amaq::server
