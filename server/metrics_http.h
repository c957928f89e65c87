// MetricsHttp: the HTTP endpoint of amaq-server, served by Boost.Beast on its own thread: the pages
// it is given (GET /metrics, the Prometheus text; GET / and /api/status, the live view:
// server/live_view.h), each rendered when asked.
// Probes for load balancers and Kubernetes, answered without the token (they tell nothing else):
// GET /healthz 200 while the process serves; GET /readyz 200 while `ready()` is true (model
// loaded, checkpoint restored, not draining), 503 otherwise.
//
// It is built for an untrusted network: connections are served concurrently (asynchronously, on
// the one thread), each must send its request and take the answer within `timeout_seconds`, at most
// `max_connections` are open at once (more are closed at once), requests are bounded in size, and
// when `token` is not empty only "Authorization: Bearer <token>" is answered (401 otherwise) for
// every page that needs it. The pages list client ids and training progress: bind it to loopback,
// or set a token.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace amaq::server {

struct MetricsOptions {
  std::string listen;              // "address:port", or a bare port for 127.0.0.1:port
  std::string token;               // empty: no authentication
  double timeout_seconds = 5;      // to receive the request and send the answer
  int max_connections = 32;
};

// A page served on GET at its path (the query string is ignored).
struct HttpPage {
  std::string content_type;
  std::function<std::string()> render;  // called on the endpoint's thread for every request
  bool needs_token = true;              // false: answered without the token, so it must reveal nothing
};

class MetricsHttp {
 public:
  // `pages` by path ("/metrics"); `ready` answers /readyz, called on the endpoint's thread. Throws
  // amaq::Error (kUnavailable) when it cannot listen, (kInvalidArgument) for a malformed address.
  // The destructor closes every connection.
  MetricsHttp(MetricsOptions options, std::map<std::string, HttpPage> pages,
              std::function<bool()> ready = [] { return true; });
  ~MetricsHttp();
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace amaq::server
