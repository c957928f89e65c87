#include "server/metrics_http.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <thread>

#include "common/error.h"
#include "common/tcp_relay.h"

namespace amaq::server {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using asio::ip::tcp;

struct MetricsHttp::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::function<std::string()> render;
  std::thread thread;

  void Serve(tcp::socket socket) {
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> request;
    boost::system::error_code ec;
    http::read(socket, buffer, request, ec);
    if (ec) return;
    http::response<http::string_body> response;
    response.version(request.version());
    response.keep_alive(false);
    if (request.method() == http::verb::get && request.target() == "/metrics") {
      response.result(http::status::ok);
      response.set(http::field::content_type, "text/plain; version=0.0.4");
      response.body() = render();
    } else {
      response.result(http::status::not_found);
      response.body() = "amaq-server serves GET /metrics\n";
    }
    response.prepare_payload();
    http::write(socket, response, ec);
  }

  void Loop() {
    while (true) {
      tcp::socket socket(io);
      boost::system::error_code ec;
      acceptor.accept(socket, ec);
      if (ec) return;  // closed
      Serve(std::move(socket));
    }
  }
};

MetricsHttp::MetricsHttp(const std::string& listen, std::function<std::string()> render) : impl_(std::make_unique<Impl>()) {
  const auto [host, port] = SplitHostPort(listen, "metrics_listen");
  impl_->render = std::move(render);
  boost::system::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec), port);
  Require(!ec, ErrorCode::kInvalidArgument, "metrics_listen must be an IP address and port, got '" + listen + "'");
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(16, ec);
  Require(!ec, ErrorCode::kUnavailable, "cannot serve metrics on " + listen + ": " + ec.message());
  impl_->thread = std::thread([this] { impl_->Loop(); });
}

MetricsHttp::~MetricsHttp() {
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);  // wakes the blocked accept()
  impl_->thread.join();
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

uint16_t MetricsHttp::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace amaq::server
