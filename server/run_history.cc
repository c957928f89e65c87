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

void RunHistory::RecordJoin(const std::string& client, const std::string& identity, int64_t steps_done, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  Client& c = clients_[client];
  if (steps_done == 0 && (!c.run.steps.empty() || !c.run.metrics.empty())) {  // a new run
    c.earlier.push_back(std::move(c.run));
    if (c.earlier.size() > kEarlierRunsKept) c.earlier.pop_front();
    c.run = Run{};
  }
  if (c.run.identity.empty()) c.run.started = seconds;
  c.run.identity = identity;  // a resumed run may continue under changed settings
}

void RunHistory::RecordStep(const std::string& client, const StepPoint& point, const std::map<int, double>& width_shares) {
  std::lock_guard<std::mutex> lock(mutex_);
  Run& r = clients_[client].run;
  if (r.offered++ % r.stride == 0 && Append(r.steps, point)) r.stride *= 2;  // from then on every other step
  if (!width_shares.empty()) r.width_shares = width_shares;
}

void RunHistory::RecordMetric(const std::string& client, MetricPoint point, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  Run& r = clients_[client].run;
  if (r.metric_name != name) r.metrics.clear();  // another metric: another curve
  r.metric_name = name;
  Append(r.metrics, point);  // evaluations are few: each is kept until the curve is full
}

std::map<std::string, RunHistory::Client> RunHistory::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clients_;
}

}  // namespace amaq::server
