// Test helper: one HTTP GET to 127.0.0.1 (the server's metrics endpoint) with an optional bearer token.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdint>
#include <string>

namespace amaq::testing {

// Returns the HTTP status (0: no answer); the body goes to `body` when given.
inline int GetMetrics(uint16_t port, const std::string& token, std::string* body = nullptr,
                      const std::string& target = "/metrics") {
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
  http::write(socket, request, ec);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  if (ec) return 0;
  if (body) *body = response.body();
  return static_cast<int>(response.result_int());
}

}  // namespace amaq::testing
