#include "client/connection_faults.h"

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <memory>

namespace amaq::client {
namespace {

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool HasAny(const std::string& text, std::initializer_list<const char*> needles) {
  return std::any_of(needles.begin(), needles.end(), [&](const char* n) { return text.find(n) != std::string::npos; });
}

// Connects `socket` to host:port within `timeout_seconds`: the connect's outcome (would_block when
// the time ran out; an error of the resolver when the host has no address).
boost::system::error_code ConnectWithin(boost::asio::io_context& io, boost::asio::ip::tcp::socket& socket, const std::string& host,
                                        uint16_t port, double timeout_seconds) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return ec;
  boost::system::error_code result = asio::error::would_block;
  asio::async_connect(socket, endpoints, [&](boost::system::error_code e, const auto&) { result = e; });
  io.run_for(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_seconds)));
  return result;
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
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  return ConnectWithin(io, socket, host, port, timeout_seconds) == boost::asio::error::connection_refused;
}

bool RequestsClientCertificate(const std::string& host, uint16_t port, const std::string& tls_name, double timeout_seconds) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  if (ConnectWithin(io, socket, host, port, timeout_seconds)) return false;
  boost::system::error_code ec;
  socket.native_non_blocking(false, ec);  // OpenSSL reads the fd itself, bounded by the timeouts below
  if (ec) return false;
  const timeval wait{static_cast<time_t>(timeout_seconds), static_cast<suseconds_t>(std::fmod(timeout_seconds, 1.0) * 1e6)};
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
  const std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> context(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!context) return false;
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_NONE, nullptr);
  // Called when the server's CertificateRequest wants a certificate: note it, offer none.
  SSL_CTX_set_client_cert_cb(context.get(), [](SSL* ssl, X509**, EVP_PKEY**) {
    *static_cast<bool*>(SSL_get_app_data(ssl)) = true;
    return 0;
  });
  const std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(context.get()), SSL_free);
  if (!ssl) return false;
  bool requested = false;
  SSL_set_app_data(ssl.get(), &requested);
  static const unsigned char kH2[] = {2, 'h', '2'};  // ALPN, as gRPC offers it
  SSL_set_alpn_protos(ssl.get(), kH2, sizeof kH2);
  SSL_set_tlsext_host_name(ssl.get(), tls_name.c_str());
  SSL_set_fd(ssl.get(), socket.native_handle());
  SSL_connect(ssl.get());  // fails or not: the callback has run if the server asked
  return requested;
}

}  // namespace amaq::client
