// Test helper: one HTTP GET to 127.0.0.1 (the server's metrics endpoint) with an optional bearer
// token; over HTTPS when given the CA that must have signed the server's certificate for localhost.
#pragma once

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <cstdint>
#include <string>

namespace amaq::testing {

// Returns the HTTP status (0: no answer, or with `ca_file` no verified TLS session); the body goes
// to `body` when given.
inline int GetMetrics(uint16_t port, const std::string& token, std::string* body = nullptr,
                      const std::string& target = "/metrics", const std::string& ca_file = "") {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return 0;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "localhost");
  if (!token.empty()) request.set(http::field::authorization, "Bearer " + token);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  const auto exchange = [&](auto& stream) {
    http::write(stream, request, ec);
    if (!ec) http::read(stream, buffer, response, ec);
  };
  if (ca_file.empty()) {
    exchange(socket);
  } else {
    asio::ssl::context tls(asio::ssl::context::tls_client);
    tls.load_verify_file(ca_file, ec);
    if (ec) return 0;
    boost::beast::ssl_stream<asio::ip::tcp::socket&> stream(socket, tls);
    stream.set_verify_mode(asio::ssl::verify_peer);
    stream.set_verify_callback(asio::ssl::host_name_verification("localhost"));
    stream.handshake(asio::ssl::stream_base::client, ec);
    if (ec) return 0;
    exchange(stream);
  }
  if (ec) return 0;
  if (body) *body = response.body();
  return static_cast<int>(response.result_int());
}

}  // namespace amaq::testing
