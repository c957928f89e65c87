// MetricsHttp: the Prometheus text endpoint (GET /metrics) of amaq-server, served by Boost.Beast
// on its own thread: per client bytes up and down (protobuf bytes as the service counted them),
// applied steps, last loss, average bits of the last activation, last step latency, connected.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace amaq::server {

class MetricsHttp {
 public:
  // `render` produces the page; throws amaq::Error (kUnavailable) when it cannot listen.
  MetricsHttp(const std::string& listen, std::function<std::string()> render);
  ~MetricsHttp();
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace amaq::server
