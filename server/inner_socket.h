// InnerSocket: where gRPC listens behind the server's front door (a TcpRelay): a Unix domain socket
// in a fresh directory of mode 0700 under $TMPDIR (or /tmp), so that only the server's user can
// connect to it and every other peer goes through the front door's limits (docs/reliability.md).
// The directory and the socket are removed when the object is destroyed; a server killed with
// SIGKILL leaves an empty amaq-server-* directory behind, which nothing reuses.
#pragma once

#include <string>

namespace amaq::server {

class InnerSocket {
 public:
  // Throws amaq::Error (kUnavailable) when the directory cannot be made, (kInvalidArgument) when
  // its path is too long for a socket address.
  InnerSocket();
  ~InnerSocket();
  InnerSocket(const InnerSocket&) = delete;
  InnerSocket& operator=(const InnerSocket&) = delete;

  const std::string& path() const { return path_; }    // the socket's file
  std::string grpc_address() const { return "unix:" + path_; }

 private:
  std::string directory_, path_;
};

}  // namespace amaq::server
