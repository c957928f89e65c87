// TcpRelay: a TCP forwarder that counts every byte it carries and can emulate a real link.
//
// The client puts one in front of its gRPC channel, so the bytes it reports are the bytes that
// crossed the socket (TLS and HTTP/2 framing included). With LinkOptions it is also the link
// emulator (amaq-netem, tests): each direction is a token bucket of the given rate followed by a
// one-way delay with jitter (order kept, as on TCP), and scheduled or on-demand faults close every
// connection, hold all traffic for a while, or silently drop everything. Bytes are counted when
// they are delivered to the far side. Its work runs on `threads` internal threads (one by default):
// each connection on one of them, given in turn, so a server's front door ends many clients' TLS
// on several cores.
// Clients always arrive over TCP; the upstream is a TCP host:port or a Unix domain socket (the
// server's gRPC listens on one behind its front door, out of reach of other local users).
// As the server's front door it may also end the clients' TLS itself (the upstream then gets plain
// HTTP/2) and watch the HTTP/2 frames each client sends, closing a connection that opens or resets
// streams too fast (Http2StreamGuard); with mutual TLS it tells the upstream's owner which
// certificate stands behind each upstream connection (ClientCertificateNames).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/net/tls_files.h"

namespace amaq {

struct LinkOptions {
  double up_bits_per_second = 0;    // towards upstream; 0: unlimited
  double down_bits_per_second = 0;  // from upstream; 0: unlimited
  uint64_t burst_bytes = 16384;     // depth of each token bucket
  double latency_seconds = 0;       // one-way delay added in each direction
  double jitter_seconds = 0;        // extra one-way delay, uniform in [0, jitter]
  // Scheduled faults, timed from the relay's start (negative: never).
  int64_t reset_after_bytes = -1;   // close every connection once this many bytes (both ways) crossed
  double reset_at_seconds = -1;     // close every connection at this time
  double stall_at_seconds = -1;     // hold all traffic from this time ...
  double stall_seconds = 0;         // ... for this long
  double blackhole_at_seconds = -1; // from this time on, drop everything and answer nothing
  uint64_t seed = 1;                // of the jitter
  // Connections open at once (0: no limit) and from one client address (0: no limit). A newcomer
  // over either limit is closed as soon as it is accepted, unless an evictable connection (of its
  // own address, for the per-address limit) makes room: the oldest is closed for it, at most
  // max(8, max_connections) a second. Evictable: open for a second or more with no byte from the
  // upstream yet (a peer that never finished its first TLS flight), or, with
  // unauthenticated_seconds > 0, open that long without the upstream's owner having reported an
  // authenticated call on it (MarkAuthenticated: a certificate, or TLS alone, is not a token).
  // Running out of file descriptors pauses accepting for 100 ms and never stops the relay.
  int max_connections = 0;
  int max_connections_per_address = 0;
  double unauthenticated_seconds = 0;  // needs TLS ended here and a Unix socket upstream
  // New connections from one client address: a burst of twice this, then this many a second; more
  // are closed as soon as they are accepted, before any TLS work (0: no bound). A handshake flood or
  // an attacker that reconnects to reset streams again then spends its own address's budget only.
  double connections_per_second_per_address = 0;
  // When the upstream ends a connection (the server gave up on it), close the client's side too,
  // whatever the client does, once what the upstream sent is delivered (false: pass the EOF on and
  // wait for the client's, as TCP's half-close does).
  bool close_with_upstream = false;
  // Threads that carry connections (1 to 64), named relay-0, relay-1, ...: relay-0 also accepts,
  // admits (the limits above) and times the scheduled faults.
  int threads = 1;
  // The server's front door. With tls.cert and tls.key set, TLS ends here (HTTP/2 by ALPN; with
  // tls.ca, only clients with a certificate that CA signed); a client that has not completed its
  // handshake within tls_handshake_seconds is closed.
  TlsFiles tls;
  double tls_handshake_seconds = 10;
  // HTTP/2 HEADERS and RST_STREAM frames one connection may send: a burst, then this many a second
  // (0: not watched; the client's bytes must then be plain HTTP/2, i.e. TLS ends here or nowhere).
  double stream_frames_per_second = 0;
  double stream_frame_burst = 0;
};

// A Unix domain socket by its file system path (at most 107 bytes).
struct UnixSocket {
  std::string path;
};

class TcpRelay {
 public:
  // Listens on `listen` ("host:port"; port 0: any free port) and forwards each connection to
  // upstream_host:upstream_port through the emulated link. Throws amaq::Error (kUnavailable) when it
  // cannot resolve the upstream or listen, (kInvalidArgument) for impossible link settings.
  TcpRelay(std::string upstream_host, uint16_t upstream_port, LinkOptions link = {},
           const std::string& listen = "127.0.0.1:0");
  // The same, forwarding to the Unix domain socket `upstream` (kInvalidArgument: path too long).
  TcpRelay(const UnixSocket& upstream, LinkOptions link = {}, const std::string& listen = "127.0.0.1:0");
  ~TcpRelay();  // closes every connection and stops
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  uint16_t port() const;
  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  uint64_t bytes_up() const;    // delivered towards upstream
  uint64_t bytes_down() const;  // delivered from upstream
  uint64_t resets() const;      // times every connection was closed by a fault
  uint64_t refused() const;     // connections closed at once (over a limit) or closed for a newcomer
  size_t open_connections() const;
  uint64_t stream_floods() const;  // connections closed for sending stream frames too fast

  // With TLS ended here and a Unix socket upstream: the names in the client certificate (common
  // name, subject alternative names; PeerCertificateNames) of the connection whose upstream end is
  // bound to `upstream_peer_path` (each is bound to its own path beside the upstream socket, which
  // the upstream sees as the peer's address). Empty when no open connection has that path, or its
  // client presented no certificate. Thread-safe.
  std::vector<std::string> ClientCertificateNames(const std::string& upstream_peer_path) const;
  // Records that the connection whose upstream end is bound to `upstream_peer_path` made an
  // authenticated call: it no longer counts as idle for eviction (unauthenticated_seconds). No
  // effect for a path no open connection has. Thread-safe.
  void MarkAuthenticated(const std::string& upstream_peer_path);

  // Faults on demand (they act on the first thread, relay-0, shortly after the call):
  void ResetConnections();                 // close every open connection, as a dropped link would
  void ResetAfter(uint64_t more_bytes);    // ... once this many more bytes have been delivered
  void Stall(double seconds);              // hold all traffic from now for this long
  void StallAfter(uint64_t more_bytes, double seconds);  // ... once this many more bytes crossed
  void Blackhole(bool on);                 // drop everything (on) or carry traffic again (off)

 private:
  void Start(const LinkOptions& link, const std::string& listen);  // listens and starts the thread

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace amaq
