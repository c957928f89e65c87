#include "client/connection_faults.h"

#include <boost/asio.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>

namespace amaq::client {
namespace {

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool HasAny(const std::string& text, std::initializer_list<const char*> needles) {
  return std::any_of(needles.begin(), needles.end(), [&](const char* n) { return text.find(n) != std::string::npos; });
}

}  // namespace

std::optional<Error> PermanentTlsFault(const grpc::Status& status, const std::string& server, const std::string& tls_name) {
  // gRPC's own transport failures only: a server's refusal (FAILED_PRECONDITION, ...) has words of
  // its own that must not be read as TLS faults.
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return std::nullopt;
  const std::string text = Lower(status.error_message());
  const std::string detail = " (gRPC: " + Excerpt(status.error_message(), 160) + ")";
  if (HasAny(text, {"not in peer certificate", "hostname mismatch"})) {
    return Error(ErrorCode::kFailedPrecondition,
                 "joining " + server + ": the server's certificate is not issued to '" + tls_name +
                     "': connect by a name it holds, or set tls_server_name to one" + detail);
  }
  if (HasAny(text, {"certificate_verify_failed", "certificate verify failed", "unable to get local issuer"})) {
    return Error(ErrorCode::kFailedPrecondition,
                 "joining " + server + ": the server's certificate does not verify against tls_ca: set tls_ca to the CA "
                 "that signed it" + detail);
  }
  if (HasAny(text, {"certificate_required", "certificate required", "peer did not return a certificate"})) {
    return Error(ErrorCode::kFailedPrecondition,
                 "joining " + server + ": the server requires a client certificate (mutual TLS): set tls_cert and "
                 "tls_key to this client's" + detail);
  }
  return std::nullopt;
}

bool RefusesConnections(const std::string& host, uint16_t port, double timeout_seconds) {
  namespace asio = boost::asio;
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return false;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code result = asio::error::would_block;
  asio::async_connect(socket, endpoints, [&](boost::system::error_code e, const auto&) { result = e; });
  io.run_for(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_seconds)));
  return result == asio::error::connection_refused;
}

}  // namespace amaq::client
