// MetricsHttp: the HTTP endpoint of amaq-server, served by Boost.Beast on its own thread: the pages
// it is given (GET /metrics, the Prometheus text; GET / and /api/status, the live view:
// server/live_view.h), each rendered when asked.
// Probes for load balancers and Kubernetes, answered without the token (they tell nothing else):
// GET /healthz 200 while the process serves; GET /readyz 200 while `ready()` is true (model
// loaded, checkpoint restored, not draining), 503 otherwise.
//
// It is built for an untrusted network: connections are served concurrently (asynchronously, on
// the one thread), each must send its request and take the answer within `timeout_seconds`, at most
// `max_connections` are open at once and `max_connections_per_address` from one address; over
// either, the oldest one still sending its request (of the newcomer's address, for the second) is
// closed for the newcomer, else the newcomer is, so slow peers cannot keep the probes out, not even
// from the prober's own address. Requests are bounded in size. With a
// certificate it speaks HTTPS only (a plain-text request is dropped at the handshake). The pages list
// client ids and training progress: with a `token` only "Authorization: Bearer <token>" gets them
// (401 otherwise); without one they are refused (403) unless `open_pages` says to serve them to
// anyone who reaches the port. Either way they are rendered for every client. A page marked
// `for_clients` also answers a client's own bearer token (`viewer_of`: the server's tokens file),
// rendered for that client alone: a tenant sees its own run and nobody else's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace amaq::server {

// Whom a page is rendered for: every client (`client` empty: the metrics token, an operator) or one.
struct Viewer {
  std::optional<std::string> client;
};

struct MetricsOptions {
  std::string listen;              // "address:port", or a bare port for 127.0.0.1:port
  std::string token;               // the bearer token the pages need; empty: see open_pages
  bool open_pages = false;         // no token: true serves the pages to anyone, false refuses them
  // A bearer token other than `token` -> whom it lets see `for_clients` pages (nullopt: nobody).
  // Called on the endpoint's thread; empty: only `token` opens pages.
  std::function<std::optional<Viewer>(const std::string& token)> viewer_of;
  // HTTPS with this PEM certificate chain and key (the server's own, tls_cert / tls_key); empty:
  // plain HTTP.
  std::string tls_cert, tls_key;
  double timeout_seconds = 5;      // to receive the request (after the TLS handshake) and send the answer
  int max_connections = 32;
  int max_connections_per_address = 4;
};

// A page served on GET at its path (the query string is ignored).
struct HttpPage {
  std::string content_type;
  std::function<std::string(const Viewer&)> render;  // called on the endpoint's thread for every request
  bool needs_token = true;   // false: answered to anyone, so it must reveal nothing
  bool for_clients = false;  // true: a client's own token (MetricsOptions::viewer_of) gets it too
};

class MetricsHttp {
 public:
  // `pages` by path ("/metrics"); `ready` answers /readyz, called on the endpoint's thread. Throws
  // amaq::Error (kUnavailable) when it cannot listen, (kInvalidArgument) for a malformed address
  // or a certificate and key that do not load, (kNotFound) for a missing certificate or key.
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
