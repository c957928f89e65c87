#include "server/live_view.h"

#include <nlohmann/json.hpp>

#include <chrono>

#include "server/split_server.h"

namespace amaq::server {
namespace {

// Steps per second over the curve's last minute (0 with fewer than two points in it).
double StepsPerSecond(const std::vector<RunHistory::StepPoint>& curve) {
  if (curve.size() < 2) return 0;
  const RunHistory::StepPoint& last = curve.back();
  size_t first = curve.size() - 1;
  while (first > 0 && last.seconds - curve[first - 1].seconds <= 60) --first;
  if (first == curve.size() - 1) first = curve.size() - 2;
  const double seconds = last.seconds - curve[first].seconds;
  return seconds > 0 ? static_cast<double>(last.step - curve[first].step) / seconds : 0;
}

nlohmann::json CurveJson(const std::vector<RunHistory::StepPoint>& curve) {
  nlohmann::json step = nlohmann::json::array(), seconds = step, loss = step, bits = step, up = step, down = step;
  for (const auto& p : curve) {
    step.push_back(p.step);
    seconds.push_back(p.seconds);
    loss.push_back(p.loss);
    bits.push_back(p.average_bits);
    up.push_back(static_cast<double>(p.bytes_up) / 1e6);
    down.push_back(static_cast<double>(p.bytes_down) / 1e6);
  }
  return {{"step", step}, {"seconds", seconds}, {"loss", loss}, {"average_bits", bits}, {"mb_up", up}, {"mb_down", down}};
}

nlohmann::json MetricsJson(const std::vector<RunHistory::MetricPoint>& metrics) {
  nlohmann::json step = nlohmann::json::array(), seconds = step, value = step;
  for (const auto& p : metrics) {
    step.push_back(p.step);
    seconds.push_back(p.seconds);
    value.push_back(p.value);
  }
  return {{"step", step}, {"seconds", seconds}, {"value", value}};
}

// A run's curves and what it was, as /api/status gives each (docs/deploy.md, "The live view").
nlohmann::json RunJson(const RunHistory::Run& run) {
  nlohmann::json widths = nlohmann::json::object();
  for (const auto& [bits, share] : run.width_shares) widths[std::to_string(bits)] = share;
  return {{"run", run.identity},
          {"run_started_seconds", run.started},
          {"steps_per_second", StepsPerSecond(run.steps)},
          {"width_shares", widths},
          {"metric_name", run.metric_name},
          {"curve", CurveJson(run.steps)},
          {"metrics", MetricsJson(run.metrics)}};
}

}  // namespace

std::string LiveStatusJson(const SplitTrainingService& service, double uptime_seconds, const Viewer& viewer) {
  const SplitServer& server = service.server();
  const auto stats = server.Stats();
  const auto traffic = service.traffic();
  const auto history = server.history().Snapshot();
  nlohmann::json clients = nlohmann::json::array();
  for (const auto& [id, s] : stats) {
    if (viewer.client && *viewer.client != id) continue;
    const auto t = traffic.find(id);
    const auto h = history.find(id);
    const RunHistory::Client empty;
    const RunHistory::Client& runs = h == history.end() ? empty : h->second;
    nlohmann::json client = RunJson(runs.run);  // the current run's, beside the session's counters
    client.update(nlohmann::json{{"id", id},
                                 {"method", s.method},
                                 {"connected", t != traffic.end() && t->second.connected},
                                 {"steps", s.steps},
                                 {"last_loss", s.last_loss},
                                 {"average_bits", s.average_bits},
                                 {"bytes_up", t == traffic.end() ? 0 : t->second.bytes_up},
                                 {"bytes_down", t == traffic.end() ? 0 : t->second.bytes_down}});
    nlohmann::json earlier = nlohmann::json::array();
    for (auto r = runs.earlier.rbegin(); r != runs.earlier.rend(); ++r) earlier.push_back(RunJson(*r));  // newest first
    client["earlier_runs"] = earlier;
    clients.push_back(client);
  }
  const nlohmann::json status = {{"server_id", service.options().server_id},
                                 {"device", server.device()},
                                 {"uptime_seconds", uptime_seconds},
                                 {"clients", clients}};
  return status.dump();
}

std::map<std::string, HttpPage> LiveViewPages(const SplitTrainingService& service) {
  const auto started = std::chrono::steady_clock::now();
  return {
      {"/", {"text/html; charset=utf-8", [](const Viewer&) { return LiveViewHtml(); }, /*needs_token=*/false}},
      {"/api/status",
       {"application/json",
        [&service, started](const Viewer& viewer) {
          const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
          return LiveStatusJson(service, uptime, viewer);
        },
        /*needs_token=*/true, /*for_clients=*/true}},
  };
}

std::function<std::optional<Viewer>(const std::string& token)> LiveViewers(SplitTrainingService& service) {
  return [&service](const std::string& token) -> std::optional<Viewer> {
    const std::optional<SplitTrainingService::Caller> caller = service.CallerOfToken(token);
    if (!caller) return std::nullopt;
    return caller->admin ? Viewer{} : Viewer{caller->client};
  };
}

}  // namespace amaq::server
