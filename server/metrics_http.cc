#include "server/metrics_http.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <list>
#include <optional>
#include <thread>
#include <variant>

#include "common/base/error.h"
#include "common/net/host_port.h"
#include "common/net/server_tls.h"

namespace amaq::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

struct MetricsHttp::Impl {
  MetricsOptions options;
  std::map<std::string, HttpPage> pages;
  std::function<bool()> ready;
  class Session;
  // The connections being served, oldest first; they outlive `io`, whose handlers own the sessions.
  std::list<std::weak_ptr<Session>> sessions;
  std::shared_ptr<asio::ssl::context> tls;  // set: every connection speaks HTTPS
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;

  std::string PageList() const {
    std::string list;
    for (const auto& [path, page] : pages) list += path + ",";
    return list;
  }

  std::chrono::steady_clock::duration timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(options.timeout_seconds));
  }

  // One connection: (with TLS, a handshake,) read one bounded request, answer it, close. Lives in
  // its handlers.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(tcp::socket socket, asio::ip::address peer, Impl& impl)
        : stream_(Stream(std::move(socket), impl)), peer_(std::move(peer)), impl_(impl) {}
    const asio::ip::address& peer() const { return peer_; }
    bool answering() const { return answering_; }
    void Close() {
      beast::error_code ignored;
      tcp_stream().socket().close(ignored);  // its pending read ends with an error and frees it
    }

    void Start() {
      parser_.header_limit(8192);
      tcp_stream().expires_after(impl_.timeout());  // covers the handshake, request and answer: a slow peer is dropped
      if (auto* tls = std::get_if<TlsStream>(&stream_)) {
        tls->async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
          if (!ec) self->Read();  // a failed handshake (plain text, a bad client) drops the connection
        });
      } else {
        Read();
      }
    }

   private:
    using TlsStream = beast::ssl_stream<beast::tcp_stream>;
    static std::variant<beast::tcp_stream, TlsStream> Stream(tcp::socket socket, Impl& impl) {
      if (impl.tls) return std::variant<beast::tcp_stream, TlsStream>(std::in_place_type<TlsStream>, std::move(socket), *impl.tls);
      return std::variant<beast::tcp_stream, TlsStream>(std::in_place_type<beast::tcp_stream>, std::move(socket));
    }
    beast::tcp_stream& tcp_stream() {
      return std::visit([](auto& s) -> beast::tcp_stream& { return beast::get_lowest_layer(s); }, stream_);
    }
    void Read() {
      std::visit(
          [this](auto& s) {
            http::async_read(s, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) { self->Answer(ec); });
          },
          stream_);
    }

    void Answer(beast::error_code ec) {
      if (ec) return;  // timed out, closed or malformed: drop the connection
      answering_ = true;
      const auto& request = parser_.get();
      response_.version(request.version());
      response_.keep_alive(false);
      const bool get = request.method() == http::verb::get;
      const std::string target(request.target());
      const auto page = impl_.pages.find(target.substr(0, target.find('?')));
      const bool has_token = !impl_.options.token.empty();
      const std::string header(request[http::field::authorization]);
      const std::string bearer = header.rfind("Bearer ", 0) == 0 ? header.substr(7) : "";
      std::optional<Viewer> viewer;
      if (has_token ? bearer == impl_.options.token : impl_.options.open_pages) {
        viewer = Viewer{};  // every client's data
      } else if (page != impl_.pages.end() && page->second.for_clients && impl_.options.viewer_of && !bearer.empty()) {
        viewer = impl_.options.viewer_of(bearer);  // one client's, or nobody's
      }
      const bool authorized = viewer.has_value();
      if (get && request.target() == "/healthz") {
        response_.result(http::status::ok);
        response_.body() = "ok\n";
      } else if (get && request.target() == "/readyz") {
        const bool ready = impl_.ready();
        response_.result(ready ? http::status::ok : http::status::service_unavailable);
        response_.body() = ready ? "ready\n" : "not ready: starting or draining\n";
      } else if (get && page != impl_.pages.end() && (authorized || !page->second.needs_token)) {
        response_.result(http::status::ok);
        response_.set(http::field::content_type, page->second.content_type);
        response_.set(http::field::cache_control, "no-store");
        response_.body() = page->second.render(viewer.value_or(Viewer{}));
      } else if (!authorized && !has_token) {
        response_.result(http::status::forbidden);
        response_.body() = "amaq-server: its pages need a metrics token: set metrics_token_file (or metrics_public: true "
                           "to serve them to anyone who reaches this port)\n";
      } else if (!authorized) {
        response_.result(http::status::unauthorized);
        response_.set(http::field::www_authenticate, "Bearer");
        response_.body() = page != impl_.pages.end() && page->second.for_clients
                               ? "amaq-server: this page needs \"Authorization: Bearer <token>\": the metrics token, or a "
                                 "client's token for that client's own run\n"
                               : "amaq-server: this page needs \"Authorization: Bearer <metrics token>\"\n";
      } else {
        response_.result(http::status::not_found);
        response_.body() = "amaq-server serves GET " + impl_.PageList() + " /healthz and /readyz\n";
      }
      response_.prepare_payload();
      std::visit(
          [this](auto& s) {
            http::async_write(s, response_, [self = shared_from_this()](beast::error_code, size_t) {
              if (auto* tls = std::get_if<TlsStream>(&self->stream_)) {
                tls->async_shutdown([self](beast::error_code) {});  // close_notify; the timeout bounds it
              } else {
                beast::error_code ignored;
                self->tcp_stream().socket().shutdown(tcp::socket::shutdown_send, ignored);
              }
            });
          },
          stream_);
    }

    std::variant<beast::tcp_stream, TlsStream> stream_;
    const asio::ip::address peer_;
    Impl& impl_;
    bool answering_ = false;  // the request has arrived
    beast::flat_buffer buffer_{8192};
    http::request_parser<http::empty_body> parser_;
    http::response<http::string_body> response_;
  };

  // Closes the oldest connection `among` accepts that is still sending its request; whether there
  // was one.
  bool CloseOldestWaiting(const std::function<bool(const Session&)>& among) {
    const auto oldest = std::find_if(sessions.begin(), sessions.end(), [&](const std::weak_ptr<Session>& s) {
      const auto session = s.lock();
      return session && !session->answering() && among(*session);
    });
    if (oldest == sessions.end()) return false;
    oldest->lock()->Close();
    sessions.erase(oldest);
    return true;
  }

  // Serves `socket`. When its address holds max_connections_per_address already, that address's
  // oldest connection still sending its request is closed to make room (one address cannot lock
  // itself out); when max_connections are open, the oldest of any address. With none to close,
  // `socket` is closed as it goes out of scope.
  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    const asio::ip::address peer = socket.remote_endpoint(ec).address();
    if (ec) return;
    sessions.remove_if([](const std::weak_ptr<Session>& s) { return s.expired(); });
    const auto from_peer = std::count_if(sessions.begin(), sessions.end(), [&](const std::weak_ptr<Session>& s) {
      const auto session = s.lock();
      return session && session->peer() == peer;
    });
    if (from_peer >= options.max_connections_per_address &&
        !CloseOldestWaiting([&](const Session& s) { return s.peer() == peer; })) {
      return;
    }
    if (sessions.size() >= static_cast<size_t>(options.max_connections) &&
        !CloseOldestWaiting([](const Session&) { return true; })) {
      return;  // every one is being answered: it ends soon
    }
    auto session = std::make_shared<Session>(std::move(socket), peer, *this);
    sessions.push_back(session);
    session->Start();
  }

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // closing
      if (ec) {  // out of file descriptors, or a transient error: pause, and keep listening
        spdlog::warn("metrics: accept failed ({}): retrying in 100 ms", ec.message());
        accept_retry.expires_after(std::chrono::milliseconds(100));
        accept_retry.async_wait([this](beast::error_code wait) {
          if (!wait) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }
};

MetricsHttp::MetricsHttp(MetricsOptions options, std::map<std::string, HttpPage> pages, std::function<bool()> ready)
    : impl_(std::make_unique<Impl>()) {
  const std::string listen = options.listen.find(':') == std::string::npos ? "127.0.0.1:" + options.listen : options.listen;
  const auto [host, port] = SplitHostPort(listen, "metrics_listen");
  impl_->options = std::move(options);
  impl_->pages = std::move(pages);
  impl_->ready = std::move(ready);
  const MetricsOptions& o = impl_->options;
  Require(o.tls_cert.empty() == o.tls_key.empty(), ErrorCode::kInvalidArgument,
          "HTTPS on the metrics port needs both a certificate and its key (tls_cert, tls_key)");
  if (!o.tls_cert.empty()) impl_->tls = ServerTlsContext(TlsFiles{o.tls_cert, o.tls_key, ""}, false, "the metrics port " + listen);
  boost::system::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec), port);
  Require(!ec, ErrorCode::kInvalidArgument, "metrics_listen must be an IP address and port, got '" + listen + "'");
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(64, ec);
  Require(!ec, ErrorCode::kUnavailable, "cannot serve metrics on " + listen + ": " + ec.message());
  if (!impl_->options.token.empty()) {
    spdlog::info("metrics on {}: /metrics and the live view need the metrics token; /healthz and /readyz are open", listen);
  } else if (impl_->options.open_pages) {
    spdlog::warn("metrics on {} without a metrics token (metrics_public: true): anyone who reaches it sees client ids "
                 "and progress; set metrics_token_file{}",
                 listen, endpoint.address().is_loopback() ? "" : " or bind to 127.0.0.1");
  } else {
    spdlog::info("metrics on {}: /healthz and /readyz only; /metrics and the live view are refused until "
                 "metrics_token_file is set (or metrics_public: true)",
                 listen);
  }
  if (impl_->tls) spdlog::info("metrics on {} speak HTTPS with {}", listen, o.tls_cert);
  impl_->Accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

MetricsHttp::~MetricsHttp() {
  impl_->io.stop();
  impl_->thread.join();
}

uint16_t MetricsHttp::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace amaq::server
