// The link emulator (TcpRelay with LinkOptions, the engine of amaq-netem) on loopback: its rate
// per direction, its latency, and each fault it injects.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/base/error.h"
#include "common/net/host_port.h"
#include "common/net/tcp_relay.h"

namespace amaq {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A server on loopback that accepts one connection and hands its socket to `serve`.
class Upstream {
 public:
  explicit Upstream(std::function<void(tcp::socket&)> serve)
      : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this, serve] {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (!ec) serve(socket);
    });
  }
  ~Upstream() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    thread_.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
};

tcp::socket Connect(asio::io_context& io, const TcpRelay& relay) {
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), relay.port()));
  return s;
}

// Reads until `n` bytes arrived or the connection ended; returns the bytes read.
size_t ReadUpTo(tcp::socket& s, size_t n) {
  std::vector<char> buffer(65536);
  size_t got = 0;
  boost::system::error_code ec;
  while (got < n) {
    const size_t k = s.read_some(asio::buffer(buffer.data(), std::min(buffer.size(), n - got)), ec);
    if (ec) break;
    got += k;
  }
  return got;
}

constexpr size_t kBytes = 2'500'000;  // one second at 20 Mbit/s

TEST(Link, UpstreamRateIsWithinTenPercentOfTheSetting) {
  std::atomic<double> seconds{0};
  Upstream sink([&](tcp::socket& s) {
    std::vector<char> first(1);
    asio::read(s, asio::buffer(first));
    const auto started = Clock::now();
    EXPECT_EQ(ReadUpTo(s, kBytes - 1), kBytes - 1);
    seconds = SecondsSince(started);
  });
  LinkOptions link;
  link.up_bits_per_second = 20e6;
  {
    TcpRelay relay("127.0.0.1", sink.port(), link);
    asio::io_context io;
    tcp::socket s = Connect(io, relay);
    asio::write(s, asio::buffer(std::vector<char>(kBytes, 'x')));
    while (relay.bytes_up() < kBytes) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double mbit = (kBytes - 1) * 8 / seconds.load() / 1e6;
  EXPECT_NEAR(mbit, 20.0, 2.0) << "measured " << mbit << " Mbit/s";
}

TEST(Link, DownstreamRateIsWithinTenPercentOfTheSetting) {
  Upstream source([&](tcp::socket& s) { asio::write(s, asio::buffer(std::vector<char>(kBytes, 'y'))); });
  LinkOptions link;
  link.down_bits_per_second = 20e6;
  link.up_bits_per_second = 1e6;  // the other direction's setting must not leak into this one
  TcpRelay relay("127.0.0.1", source.port(), link);
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  std::vector<char> first(1);
  asio::read(s, asio::buffer(first));
  const auto started = Clock::now();
  ASSERT_EQ(ReadUpTo(s, kBytes - 1), kBytes - 1);
  const double mbit = (kBytes - 1) * 8 / SecondsSince(started) / 1e6;
  EXPECT_NEAR(mbit, 20.0, 2.0) << "measured " << mbit << " Mbit/s";
  EXPECT_LE(relay.bytes_down(), kBytes);  // counted once a write completes: never more than was sent
}

TEST(Link, LatencyDelaysEachDirection) {
  Upstream echo([](tcp::socket& s) {
    std::vector<char> b(4);
    while (true) {
      boost::system::error_code ec;
      asio::read(s, asio::buffer(b), ec);
      if (ec) return;
      asio::write(s, asio::buffer(b), ec);
    }
  });
  LinkOptions link;
  link.latency_seconds = 0.05;
  link.jitter_seconds = 0.01;
  TcpRelay relay("127.0.0.1", echo.port(), link);
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  std::vector<char> b(4, 'p');
  // Every round trip waits for both delays; the fastest of five, which a busy machine slows only
  // if it slows all five, stays below one more delay (a delay applied twice in a direction).
  double fastest = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto started = Clock::now();
    asio::write(s, asio::buffer(b));
    asio::read(s, asio::buffer(b));
    const double rtt = SecondsSince(started);
    EXPECT_GE(rtt, 0.1);
    fastest = std::min(fastest, rtt);
  }
  EXPECT_LT(fastest, 0.1 + 2 * 0.01 + 0.05) << "fastest round trip " << fastest << " s";
}

TEST(Link, ResetAfterBytesClosesTheConnectionMidStream) {
  Upstream sink([](tcp::socket& s) { ReadUpTo(s, kBytes); });
  LinkOptions link;
  link.reset_after_bytes = 100000;
  TcpRelay relay("127.0.0.1", sink.port(), link);
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  boost::system::error_code ec;
  const std::vector<char> data(kBytes, 'z');
  asio::write(s, asio::buffer(data), ec);
  // The write fails, or the peer's close shows up as EOF on the next read.
  if (!ec) {
    std::vector<char> b(1);
    s.read_some(asio::buffer(b), ec);
  }
  EXPECT_TRUE(ec) << "the link must have been closed";
  EXPECT_EQ(relay.resets(), 1u);
  EXPECT_GE(relay.bytes_up(), 100000u);
  EXPECT_LT(relay.bytes_up(), 100000u + 16384u) << "the reset must come right after the threshold";
}

TEST(Link, StallHoldsTrafficThenDeliversIt) {
  Upstream echo([](tcp::socket& s) {
    std::vector<char> b(4);
    boost::system::error_code ec;
    asio::read(s, asio::buffer(b), ec);
    if (!ec) asio::write(s, asio::buffer(b), ec);
  });
  TcpRelay relay("127.0.0.1", echo.port());
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  relay.Stall(0.4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto started = Clock::now();
  std::vector<char> b(4, 's');
  asio::write(s, asio::buffer(b));
  asio::read(s, asio::buffer(b));
  const double waited = SecondsSince(started);
  EXPECT_GE(waited, 0.3) << "the stall must hold the message";
  EXPECT_LT(waited, 1.0);
  EXPECT_EQ(std::string(b.begin(), b.end()), "ssss") << "nothing is lost by a stall";
}

TEST(Link, BlackholeDropsEverythingSilently) {
  std::atomic<size_t> received{0};
  Upstream sink([&](tcp::socket& s) { received = ReadUpTo(s, 1000); });
  LinkOptions link;
  link.blackhole_at_seconds = 0;
  {
    TcpRelay relay("127.0.0.1", sink.port(), link);
    asio::io_context io;
    tcp::socket s = Connect(io, relay);
    asio::write(s, asio::buffer(std::vector<char>(1000, 'b')));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(relay.bytes_up(), 0u);
    EXPECT_EQ(relay.resets(), 0u) << "a blackhole does not close the connection";
  }
  EXPECT_EQ(received.load(), 0u);
}

// An unshaped relay adds no delay of its own: messages of several chunks (a step's request) cross
// it without waiting for delayed ACKs (Nagle's algorithm is off on both sockets).
TEST(Link, UnshapedRelayAddsNoDelayToMultiChunkMessages) {
  constexpr size_t kMessage = 40000;  // three reads of the relay
  Upstream echo([](tcp::socket& s) {
    std::vector<char> b(kMessage);
    boost::system::error_code ec;
    while (!ec) {
      asio::read(s, asio::buffer(b), ec);
      if (!ec) asio::write(s, asio::buffer(b), ec);
    }
  });
  TcpRelay relay("127.0.0.1", echo.port());
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  s.set_option(tcp::no_delay(true));
  std::vector<char> b(kMessage, 'n');
  // A delayed ACK costs 40 ms on every trip; the fastest of 20 is free of a busy machine's noise.
  double fastest = 1e9;
  for (int i = 0; i < 20; ++i) {
    const auto started = Clock::now();
    asio::write(s, asio::buffer(b));
    asio::read(s, asio::buffer(b));
    fastest = std::min(fastest, SecondsSince(started));
  }
  EXPECT_LT(fastest, 0.015) << "the fastest round trip took " << fastest * 1e3 << " ms (delayed ACKs: is TCP_NODELAY set?)";
}

TEST(Link, ScheduledFaultsStrikeAtTheirTimes) {
  Upstream echo([](tcp::socket& s) {
    std::vector<char> b(4);
    boost::system::error_code ec;
    while (!ec) {
      asio::read(s, asio::buffer(b), ec);
      if (!ec) asio::write(s, asio::buffer(b), ec);
    }
  });
  LinkOptions link;
  link.stall_at_seconds = 0.2;
  link.stall_seconds = 0.3;
  link.reset_at_seconds = 0.8;
  const auto started = Clock::now();
  TcpRelay relay("127.0.0.1", echo.port(), link);
  asio::io_context io;
  tcp::socket s = Connect(io, relay);
  std::vector<char> b(4, 'e');
  asio::write(s, asio::buffer(b));
  asio::read(s, asio::buffer(b));
  EXPECT_LT(SecondsSince(started), 0.2) << "before the stall the link is quick";
  std::this_thread::sleep_for(std::chrono::milliseconds(250) - (Clock::now() - started));
  asio::write(s, asio::buffer(b));
  asio::read(s, asio::buffer(b));
  EXPECT_GE(SecondsSince(started), 0.45) << "an echo sent during the stall arrives after it";
  boost::system::error_code ec;
  asio::read(s, asio::buffer(b), ec);  // nothing more comes: the scheduled reset ends the wait
  EXPECT_TRUE(ec);
  EXPECT_GE(SecondsSince(started), 0.75);
  EXPECT_EQ(relay.resets(), 1u);
}

TEST(Link, RefusesImpossibleSettings) {
  LinkOptions link;
  link.latency_seconds = -1;
  try {
    TcpRelay relay("127.0.0.1", 1, link);
    FAIL() << "a negative latency must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_THROW(TcpRelay("127.0.0.1", 1, LinkOptions{}, "not-an-ip:0"), Error);
}

// Issue 40 item 5: a port out of range says so, not "must be host:port".
TEST(HostPort, APortOutOfRangeSaysItsRange) {
  EXPECT_EQ(SplitHostPort("gpu-host:50051", "server"), (std::pair<std::string, uint16_t>{"gpu-host", 50051}));
  EXPECT_EQ(SplitHostPort("[::1]:0", "listen"), (std::pair<std::string, uint16_t>{"::1", 0}));
  const auto message = [](const std::string& address) {
    try {
      SplitHostPort(address, "listen");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("127.0.0.1:99999").find("'listen': port must be 1..65535"), std::string::npos) << message("127.0.0.1:99999");
  EXPECT_NE(message("127.0.0.1:12345678901").find("must be host:port"), std::string::npos);
  EXPECT_NE(message("localhost").find("must be host:port"), std::string::npos);
  EXPECT_NE(message("localhost:80a").find("must be host:port"), std::string::npos);
  EXPECT_NE(message(":80").find("must be host:port"), std::string::npos);
}

// The server's front door forwards to gRPC's private Unix socket: bytes cross both ways, counted.
TEST(Link, ForwardsToAUnixSocketUpstream) {
  char directory[] = "/tmp/amaq-link-XXXXXX";
  ASSERT_NE(::mkdtemp(directory), nullptr);
  const std::string path = std::string(directory) + "/upstream.sock";
  asio::io_context upstream_io;
  asio::local::stream_protocol::acceptor acceptor(upstream_io, asio::local::stream_protocol::endpoint(path));
  std::thread echo([&] {
    asio::local::stream_protocol::socket s(upstream_io);
    acceptor.accept(s);
    std::vector<char> buffer(4096);
    boost::system::error_code read, written;
    while (!read && !written) {
      const size_t n = s.read_some(asio::buffer(buffer), read);
      asio::write(s, asio::buffer(buffer.data(), n), written);
    }
  });
  {
    TcpRelay relay(UnixSocket{path});
    asio::io_context io;
    tcp::socket client = Connect(io, relay);
    asio::write(client, asio::buffer("hello", 5));
    std::array<char, 5> back{};
    asio::read(client, asio::buffer(back));
    EXPECT_EQ(std::string(back.begin(), back.end()), "hello");
    // Counted when the relay's write completes, which may be just after the client has the bytes.
    for (int i = 0; i < 250 && relay.bytes_down() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(relay.bytes_up(), 5u);
    EXPECT_EQ(relay.bytes_down(), 5u);
  }
  echo.join();
  ::unlink(path.c_str());
  ::rmdir(directory);
  try {
    TcpRelay relay(UnixSocket{"/tmp/" + std::string(200, 'x')});
    FAIL() << "a path longer than a socket address holds must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("choose a shorter directory"), std::string::npos) << e.what();
  }
}

// The front door of amaq-server: past max_connections a connection is closed as soon as it is
// accepted; once the others are gone, new ones are carried again.
TEST(Link, ConnectionsAboveTheLimitAreClosedAtOnce) {
  Upstream upstream([](tcp::socket& s) {
    std::vector<char> buffer(4096);
    boost::system::error_code read, written;
    while (!read && !written) {
      const size_t n = s.read_some(asio::buffer(buffer), read);
      asio::write(s, asio::buffer(buffer.data(), n), written);
    }
  });
  LinkOptions link;
  link.max_connections = 1;
  TcpRelay relay("127.0.0.1", upstream.port(), link);
  asio::io_context io;
  tcp::socket first = Connect(io, relay);
  asio::write(first, asio::buffer("x", 1));
  EXPECT_EQ(ReadUpTo(first, 1), 1u) << "the connection within the limit is carried";
  tcp::socket second = Connect(io, relay);
  char byte = 0;
  boost::system::error_code ec;
  second.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  EXPECT_EQ(relay.refused(), 1u);
  first.close();  // the upstream echo ends too, and the relay lets the connection go
  ASSERT_TRUE([&] {
    for (int i = 0; i < 250 && relay.open_connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return relay.open_connections() == 0;
  }());
  tcp::socket third = Connect(io, relay);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(relay.refused(), 1u) << "the free slot takes the next connection";
  EXPECT_EQ(relay.open_connections(), 1u);
}

// A server on loopback that echoes every connection it accepts, each on a thread of its own, until
// its peer ends it. Its connections must have ended before it is destroyed.
class EchoUpstream {
 public:
  EchoUpstream() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    accepting_ = std::thread([this] {
      for (;;) {
        auto s = std::make_shared<tcp::socket>(io_);
        boost::system::error_code ec;
        acceptor_.accept(*s, ec);
        if (ec || stopping_) return;
        echoes_.emplace_back([s] {
          std::vector<char> buffer(8192);
          boost::system::error_code read, written;
          while (!read && !written) {
            const size_t n = s->read_some(asio::buffer(buffer), read);
            asio::write(*s, asio::buffer(buffer.data(), n), written);
          }
        });
      }
    });
  }
  ~EchoUpstream() {
    stopping_ = true;
    tcp::socket wake(io_);  // a blocking accept does not return when its socket is closed
    wake.connect(acceptor_.local_endpoint());
    accepting_.join();
    for (std::thread& t : echoes_) t.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> echoes_;
  std::thread accepting_;
};

// Connections spread over several threads (the server's front door, front_door_threads): each of
// 12 concurrent streams is carried whole and in order, the counters add up across threads, a reset
// closes the connections of every thread, and the relay stops with connections open on each.
TEST(Link, ConnectionsOnSeveralThreadsAreEachCarriedWholeAndClosedTogether) {
  EchoUpstream upstream;
  LinkOptions link;
  link.threads = 3;
  {
    TcpRelay relay("127.0.0.1", upstream.port(), link);
    constexpr int kStreams = 12;
    constexpr size_t kStreamBytes = 1 << 20;
    std::atomic<int> whole{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < kStreams; ++i) {
      clients.emplace_back([&, i] {
        asio::io_context io;
        tcp::socket s = Connect(io, relay);
        std::vector<char> sent(kStreamBytes), echoed(kStreamBytes);
        for (size_t k = 0; k < sent.size(); ++k) sent[k] = static_cast<char>((k * 7 + static_cast<size_t>(i) * 131) >> 3);
        std::thread writer([&] { asio::write(s, asio::buffer(sent)); });
        boost::system::error_code ec;
        asio::read(s, asio::buffer(echoed), ec);
        writer.join();
        if (!ec && echoed == sent) ++whole;
      });
    }
    for (std::thread& t : clients) t.join();
    EXPECT_EQ(whole, kStreams) << "every stream came back whole and in order";
    // A write is counted when its completion runs on the relay's thread, after the reader may have it.
    for (int i = 0; i < 100 && relay.bytes_down() < kStreams * kStreamBytes; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(relay.bytes_up(), kStreams * kStreamBytes);
    EXPECT_EQ(relay.bytes_down(), kStreams * kStreamBytes);

    asio::io_context io;
    std::vector<tcp::socket> open;
    for (int i = 0; i < 6; ++i) {  // two on each thread, each carried before the reset
      open.push_back(Connect(io, relay));
      asio::write(open.back(), asio::buffer("x", 1));
      EXPECT_EQ(ReadUpTo(open.back(), 1), 1u);
    }
    relay.ResetConnections();
    for (tcp::socket& s : open) {
      char byte = 0;
      boost::system::error_code ec;
      s.read_some(asio::buffer(&byte, 1), ec);
      EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
    }
    EXPECT_EQ(relay.resets(), 1u);
    for (int i = 0; i < 6; ++i) {  // open again on every thread when the relay stops
      open.push_back(Connect(io, relay));
      asio::write(open.back(), asio::buffer("y", 1));
      EXPECT_EQ(ReadUpTo(open.back(), 1), 1u);
    }
  }  // ~TcpRelay closes them and returns (a hang here fails the test by its timeout)
}

// Admission runs on the first thread and evicts connections that live on the others: with two
// threads and max_connections 2, each newcomer closes the oldest idle connection (no byte from the
// upstream after a second), whichever thread carries it, and is carried itself.
TEST(Link, ANewcomerEvictsAnIdleConnectionOnAnotherThread) {
  EchoUpstream upstream;
  LinkOptions link;
  link.threads = 2;
  link.max_connections = 2;
  TcpRelay relay("127.0.0.1", upstream.port(), link);
  asio::io_context io;
  std::vector<tcp::socket> idle;
  idle.push_back(Connect(io, relay));  // on relay-0
  idle.push_back(Connect(io, relay));  // on relay-1
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  for (int i = 0; i < 2; ++i) {
    tcp::socket newcomer = Connect(io, relay);
    char byte = 0;
    boost::system::error_code ec;
    idle[static_cast<size_t>(i)].read_some(asio::buffer(&byte, 1), ec);
    EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << "idle connection " << i << ": " << ec.message();
    asio::write(newcomer, asio::buffer("z", 1));
    EXPECT_EQ(ReadUpTo(newcomer, 1), 1u) << "newcomer " << i << " is carried";
    idle[static_cast<size_t>(i)] = std::move(newcomer);  // it holds the slot now, and is not idle
  }
  EXPECT_EQ(relay.refused(), 2u);
  EXPECT_EQ(relay.open_connections(), 2u);
}

}  // namespace
}  // namespace amaq
