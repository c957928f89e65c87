// TcpRelay: a TCP forwarder on a local port that counts every byte it carries. The client puts one
// in front of its gRPC channel, so the bytes it reports are the bytes that crossed the socket
// (TLS and HTTP/2 framing included), not numbers recomputed from message sizes. The link emulator
// (amaq-netem) builds on the same class to shape and break links.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace amaq {

class TcpRelay {
 public:
  // Listens on 127.0.0.1 (port 0: any free port) and forwards each connection to
  // upstream_host:upstream_port. Throws amaq::Error (kUnavailable) when it cannot listen.
  TcpRelay(std::string upstream_host, uint16_t upstream_port, uint16_t listen_port = 0);
  ~TcpRelay();  // closes every connection and stops
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  uint16_t port() const;
  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  uint64_t bytes_up() const;    // towards upstream
  uint64_t bytes_down() const;  // from upstream
  // Closes every open connection (both directions), as a dropped link would.
  void ResetConnections();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits "host:port"; throws amaq::Error (kInvalidArgument) naming `key` when malformed.
std::pair<std::string, uint16_t> SplitHostPort(const std::string& address, const std::string& key);

}  // namespace amaq
