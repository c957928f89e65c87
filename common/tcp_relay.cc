#include "common/tcp_relay.h"

#include <boost/asio.hpp>

#include <array>
#include <list>
#include <mutex>

#include "common/error.h"

namespace amaq {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// One relayed connection: two sockets and a pump in each direction.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(asio::io_context& io, std::atomic<uint64_t>& up, std::atomic<uint64_t>& down)
      : client(io), upstream(io), up_bytes(up), down_bytes(down) {}

  void Start() {
    Pump(client, upstream, up_buffer, up_bytes);
    Pump(upstream, client, down_buffer, down_bytes);
  }

  void Pump(tcp::socket& from, tcp::socket& to, std::array<char, 65536>& buffer, std::atomic<uint64_t>& counter) {
    auto self = shared_from_this();
    from.async_read_some(asio::buffer(buffer), [this, self, &from, &to, &buffer, &counter](boost::system::error_code ec, size_t n) {
      if (ec) return Close();
      asio::async_write(to, asio::buffer(buffer.data(), n), [this, self, &from, &to, &buffer, &counter, n](boost::system::error_code wec, size_t) {
        if (wec) return Close();
        counter += n;
        Pump(from, to, buffer, counter);
      });
    });
  }

  void Close() {
    boost::system::error_code ignored;
    client.close(ignored);
    upstream.close(ignored);
  }

  tcp::socket client, upstream;
  std::array<char, 65536> up_buffer{}, down_buffer{};
  std::atomic<uint64_t>& up_bytes;
  std::atomic<uint64_t>& down_bytes;
};

}  // namespace

struct TcpRelay::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  tcp::endpoint upstream;
  std::atomic<uint64_t> up{0}, down{0};
  std::mutex mutex;
  std::list<std::weak_ptr<Connection>> connections;
  std::thread thread;

  void Accept() {
    auto connection = std::make_shared<Connection>(io, up, down);
    acceptor.async_accept(connection->client, [this, connection](boost::system::error_code ec) {
      if (ec) return;  // the acceptor was closed
      connection->upstream.async_connect(upstream, [connection](boost::system::error_code cec) {
        if (cec) return connection->Close();
        connection->Start();
      });
      {
        std::lock_guard<std::mutex> lock(mutex);
        connections.remove_if([](const std::weak_ptr<Connection>& c) { return c.expired(); });
        connections.push_back(connection);
      }
      Accept();
    });
  }
};

TcpRelay::TcpRelay(std::string upstream_host, uint16_t upstream_port, uint16_t listen_port) : impl_(std::make_unique<Impl>()) {
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(upstream_host, std::to_string(upstream_port), ec);
  Require(!ec && !endpoints.empty(), ErrorCode::kUnavailable,
          "cannot resolve " + upstream_host + ": " + ec.message() + ": check the server address");
  impl_->upstream = *endpoints.begin();
  const tcp::endpoint local(asio::ip::make_address("127.0.0.1"), listen_port);
  impl_->acceptor.open(local.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(local, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  Require(!ec, ErrorCode::kUnavailable, "cannot listen on 127.0.0.1:" + std::to_string(listen_port) + ": " + ec.message());
  impl_->Accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

TcpRelay::~TcpRelay() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& c : impl_->connections) {
      if (auto connection = c.lock()) connection->Close();
    }
  });
  impl_->io.stop();
  impl_->thread.join();
}

uint16_t TcpRelay::port() const { return impl_->acceptor.local_endpoint().port(); }
uint64_t TcpRelay::bytes_up() const { return impl_->up.load(); }
uint64_t TcpRelay::bytes_down() const { return impl_->down.load(); }

void TcpRelay::ResetConnections() {
  asio::post(impl_->io, [this] {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& c : impl_->connections) {
      if (auto connection = c.lock()) connection->Close();
    }
  });
}

std::pair<std::string, uint16_t> SplitHostPort(const std::string& address, const std::string& key) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      port = -1;
    }
  }
  Require(port > 0 && port < 65536, ErrorCode::kInvalidArgument,
          "'" + key + "' must be host:port (e.g. localhost:50051), got '" + address + "'");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace amaq
