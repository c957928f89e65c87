#include "common/net/tcp_relay.h"

#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/base/error.h"
#include "common/net/host_port.h"
#include "common/net/http2_stream_guard.h"
#include "common/net/server_tls.h"

namespace amaq {

namespace asio = boost::asio;
using asio::ip::tcp;
// Both ends are generic stream sockets: clients arrive over TCP, the upstream is TCP or a Unix
// domain socket.
using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadBytes = 16384;
// A connection that has had no byte from the upstream may be closed for a newcomer once it is this old.
constexpr auto kEvictableAfter = std::chrono::seconds(1);

Clock::duration Seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

struct RelayConnection;

// The IP address of a TCP endpoint, as text.
std::string PeerAddress(const Endpoint& endpoint) {
  const sockaddr* address = endpoint.data();
  char text[INET6_ADDRSTRLEN] = "";
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text, sizeof(text));
  }
  return text;
}

// The state every connection shares: the link's settings, its faults and its counters. The
// acceptor, the admission state (guarded by mutex) and the scheduled faults' timers live on the
// first thread (io); each connection lives on one thread of `threads` (its io_context), given in
// turn, and touches what it shares with the others through the atomics and mutexes below.
struct Relay {
  asio::io_context io;  // the first thread's
  // The further threads' (link.threads - 1), each kept running until the relay stops.
  std::vector<std::unique_ptr<asio::io_context>> more_io;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> keep_running;
  size_t next_io = 0;  // the io_context of the next connection, in turn (the acceptor's thread only)
  tcp::acceptor acceptor{io};
  Endpoint upstream;
  LinkOptions link;
  Clock::time_point started = Clock::now();
  // The link's state over time and its jitter; guarded by faults_mutex.
  mutable std::mutex faults_mutex;
  Clock::time_point stall_from = Clock::time_point::max(), stall_until = Clock::time_point::min();
  Clock::time_point blackhole_from = Clock::time_point::max();
  // A fault armed to strike once this many more bytes have been delivered (-1: none).
  int64_t fault_budget = -1;
  std::function<void()> fault;
  std::mt19937_64 jitter_rng;
  asio::steady_timer reset_timer{io};
  asio::steady_timer accept_retry{io};
  std::atomic<uint64_t> up{0}, down{0}, reset_count{0}, refused{0}, stream_floods{0};
  std::mutex mutex;  // guards connections, arrivals and the eviction window
  std::list<std::weak_ptr<RelayConnection>> connections;
  std::shared_ptr<asio::ssl::context> tls;  // set: TLS from clients ends here
  // With TLS ended here and a Unix socket upstream: the folder where each upstream end is bound to
  // a path of its own, and by that path the client certificate's names and whether the upstream
  // has reported an authenticated call on it (MarkAuthenticated; guarded by names_mutex).
  std::string peer_folder;
  std::atomic<uint64_t> peers_bound{0};
  struct UpstreamPeer {
    std::vector<std::string> names;
    bool authenticated = false;
  };
  mutable std::mutex names_mutex;
  std::map<std::string, UpstreamPeer> peers_by_path;
  // connections_per_second_per_address: each address's arrivals, a token bucket (tokens at `at`).
  struct Arrivals {
    double tokens = 0;
    Clock::time_point at{};
  };
  std::map<std::string, Arrivals> arrivals;
  // Evictions in the second that began at eviction_window (at most max(8, max_connections) a second).
  Clock::time_point eviction_window{};
  int evictions_in_window = 0;
  std::vector<std::thread> threads;

  asio::io_context& NextIo();
  bool Blackholed() const;
  bool Stalled(Clock::time_point t) const;
  Clock::time_point StallUntil() const;
  double Jitter();  // one draw of the extra delay, in seconds
  void Delivered(size_t n);
  // Closes every open connection (each on its own thread: at once where that is the caller's).
  void CloseAll();
  void Stall(Clock::time_point from, double seconds);
  // Arms `action` to run once `bytes` more (at least 1) have been delivered.
  void ArmFault(uint64_t bytes, std::function<void()> action);
  // Registers a newly accepted connection within the limits (max_connections_per_address, then
  // max_connections), an evictable connection making room where one is full (of that address, then
  // of any); false: close it.
  bool Admit(const std::shared_ptr<RelayConnection>& connection);
  // Whether `c` may be closed for a newcomer: no byte from the upstream a second after its accept,
  // or (with unauthenticated_seconds) no authenticated call reported that long after it. Needs mutex.
  bool Evictable(const RelayConnection& c, Clock::time_point now) const;
  // Closes the oldest evictable connection `among` accepts (on its thread, out of the count at once),
  // within the eviction rate; whether it closed one. Needs mutex.
  bool EvictFor(const std::function<bool(const RelayConnection&)>& among);
  // Whether `address` may open one more connection now (connections_per_second_per_address); takes
  // it from the address's bucket. Needs mutex.
  bool TakeArrival(const std::string& address, Clock::time_point now);
  void Accept();
  // An admitted connection, on its own thread: its TLS handshake (when TLS ends here) within the
  // time allowed, then ConnectUpstream.
  void Handshake(const std::shared_ptr<RelayConnection>& connection);
  // Opens the upstream end (bound to a path of its own under peer_folder, where `names` are
  // recorded for ClientCertificateNames), connects it and starts relaying.
  void ConnectUpstream(const std::shared_ptr<RelayConnection>& connection, std::vector<std::string> names);
};

// One direction of one connection: a token bucket, then a delay line, then the far socket.
struct Pipe {
  Pipe(asio::io_context& io, Socket& from_socket, Socket& to_socket, double bits_per_second,
       std::atomic<uint64_t>& counter)
      : from(from_socket), to(to_socket), bytes_per_second(bits_per_second / 8), delivered(counter), timer(io) {}

  struct Chunk {
    std::vector<char> bytes;
    Clock::time_point due;
  };
  Socket& from;
  Socket& to;
  double bytes_per_second;  // 0: unlimited
  std::atomic<uint64_t>& delivered;
  asio::steady_timer timer;
  std::array<char, kReadBytes> buffer{};
  std::deque<Chunk> queue;
  size_t queued_bytes = 0;
  Clock::time_point bucket_time = Clock::time_point::min();  // GCRA's theoretical arrival time
  Clock::time_point last_due = Clock::time_point::min();
  std::atomic<uint64_t> bytes_read{0};  // from the sending side, ever (read by the acceptor's thread)
  bool reading = false, writing = false;
  bool ended = false;  // the sending side closed: no more reads
};


struct RelayConnection : std::enable_shared_from_this<RelayConnection> {
  // Every socket and timer of the connection is on `io`, the one thread it lives on.
  RelayConnection(Relay& relay, asio::io_context& io)
      : link(relay), client(io), upstream(io), handshake_timer(io),
        up(io, client, upstream, relay.link.up_bits_per_second, relay.up),
        down(io, upstream, client, relay.link.down_bits_per_second, relay.down) {
    if (relay.tls) tls.emplace(client, *relay.tls);
    if (relay.link.stream_frames_per_second > 0) {
      guard.emplace(relay.link.stream_frames_per_second, std::max(1.0, relay.link.stream_frame_burst));
    }
    const double delay = link.link.latency_seconds + link.link.jitter_seconds;
    for (Pipe* p : {&up, &down}) {
      // The bytes a pipe holds before it stops reading: a router's queue plus what is in flight.
      queue_limit[p == &down] = p->bytes_per_second > 0 ? 262144 + static_cast<size_t>(p->bytes_per_second * delay) : 1 << 20;
    }
  }

  void Start() {
    // Forward each chunk as soon as it is due: with Nagle's algorithm a chunk's tail would wait
    // for the peer's delayed ACK (tens of milliseconds a step; gRPC's own sockets disable it too).
    // A Unix domain socket has no such option: its error is ignored.
    boost::system::error_code ignored;
    client.set_option(tcp::no_delay(true), ignored);
    upstream.set_option(tcp::no_delay(true), ignored);
    Read(up);
    Read(down);
  }

  size_t Limit(const Pipe& p) const { return queue_limit[&p == &down]; }

  void Read(Pipe& p) {
    p.reading = true;
    auto self = shared_from_this();
    auto read = [this, self, &p](boost::system::error_code ec, size_t n) {
      p.reading = false;
      if (ec == asio::error::eof) {  // the sender is done: deliver what is queued, then pass the EOF on
        p.ended = true;
        if (!p.writing) Next(p);  // else the write in flight continues with Next
        return;
      }
      if (ec || closed) return Close();
      p.bytes_read += n;
      if (&p == &up && guard && !guard->Feed(p.buffer.data(), n, Clock::now())) return CloseFlood();
      if (!link.Blackholed()) Enqueue(p, n);
      if (p.queued_bytes < Limit(p)) Read(p);
    };
    if (tls && &p == &up) return tls->async_read_some(asio::buffer(p.buffer), std::move(read));
    p.from.async_read_some(asio::buffer(p.buffer), std::move(read));
  }

  void CloseFlood() {
    const uint64_t floods = ++link.stream_floods;
    if ((floods & (floods - 1)) == 0) {  // the 1st, 2nd, 4th, 8th ...: an attack does not flood the log
      spdlog::warn("front door: closed a connection from {} that sent {} HTTP/2 stream frames (HEADERS, RST_STREAM) "
                   "faster than stream_frames_per_second {} allows ({} such connections so far)",
                   peer_address, guard->stream_frames(), link.link.stream_frames_per_second, floods);
    }
    Close();
  }

  void Enqueue(Pipe& p, size_t n) {
    const Clock::time_point now = Clock::now();
    Clock::time_point departs = now;
    if (p.bytes_per_second > 0) {
      // Token bucket as GCRA: a chunk leaves when the bucket has tokens for it.
      p.bucket_time = std::max(p.bucket_time, now) + Seconds(static_cast<double>(n) / p.bytes_per_second);
      departs = std::max(now, p.bucket_time - Seconds(static_cast<double>(link.link.burst_bytes) / p.bytes_per_second));
    }
    const double delay = link.link.latency_seconds + (link.link.jitter_seconds > 0 ? link.Jitter() : 0);
    p.last_due = std::max(p.last_due, departs + Seconds(delay));  // TCP keeps the order
    p.queue.push_back({std::vector<char>(p.buffer.begin(), p.buffer.begin() + static_cast<std::ptrdiff_t>(n)), p.last_due});
    p.queued_bytes += n;
    Write(p);
  }

  void Write(Pipe& p) {
    if (p.writing || p.queue.empty() || closed) return;
    p.writing = true;
    Clock::time_point due = p.queue.front().due;
    if (link.Stalled(std::max(due, Clock::now()))) due = link.StallUntil();
    p.timer.expires_at(due);
    auto self = shared_from_this();
    p.timer.async_wait([this, self, &p](boost::system::error_code ec) {
      if (ec || closed) return;
      if (link.Blackholed()) {
        p.queued_bytes -= p.queue.front().bytes.size();
        p.queue.pop_front();
        return Next(p);
      }
      if (link.Stalled(Clock::now())) return Next(p);  // a stall began meanwhile: wait it out
      auto written = [this, self, &p](boost::system::error_code wec, size_t n) {
        if (wec) return Close();
        p.queued_bytes -= n;
        p.queue.pop_front();
        p.delivered += n;
        Next(p);
        link.Delivered(n);
      };
      if (tls && &p == &down) return asio::async_write(*tls, asio::buffer(p.queue.front().bytes), std::move(written));
      asio::async_write(p.to, asio::buffer(p.queue.front().bytes), std::move(written));
    });
  }

  // Called when the pipe's write (or wait) has finished: starts the next one.
  void Next(Pipe& p) {
    p.writing = false;
    if (closed) return;
    if (p.ended) {
      if (!p.queue.empty()) return Write(p);
      if (&p == &down && link.link.close_with_upstream) return Close();
      boost::system::error_code ignored;
      p.to.shutdown(asio::socket_base::shutdown_send, ignored);
      if (up.ended && down.ended && up.queue.empty() && down.queue.empty()) Close();
      return;
    }
    if (!p.reading && p.queued_bytes < Limit(p)) Read(p);
    Write(p);
  }

  void Close() {
    if (closed.exchange(true)) return;
    boost::system::error_code ignored;
    client.close(ignored);
    upstream.close(ignored);
    up.timer.cancel();
    down.timer.cancel();
    handshake_timer.cancel();
    if (!upstream_path.empty()) {
      std::lock_guard<std::mutex> lock(link.names_mutex);
      link.peers_by_path.erase(upstream_path);
    }
  }

  Relay& link;
  Socket client, upstream;
  std::optional<asio::ssl::stream<Socket&>> tls;  // set: TLS from the client ends here
  std::optional<Http2StreamGuard> guard;           // set: the client's stream frames are counted
  asio::steady_timer handshake_timer;
  // Where the upstream end is bound (empty: not bound); set on the connection's thread under
  // Relay::names_mutex, which other threads hold to read it.
  std::string upstream_path;
  std::string peer_address;  // the client's IP address; set under Relay::mutex before the connection starts
  const Clock::time_point accepted = Clock::now();
  Pipe up, down;
  size_t queue_limit[2] = {0, 0};
  std::atomic<bool> closed{false};  // read by the acceptor's thread (Evictable)
};

}  // namespace

struct TcpRelay::Impl : Relay {};

// Runs `connection`'s Close on its own thread: at once when that is the caller's, else queued.
void CloseOnItsThread(const std::shared_ptr<RelayConnection>& connection) {
  asio::dispatch(connection->client.get_executor(), [connection] { connection->Close(); });
}

asio::io_context& Relay::NextIo() {
  const size_t i = next_io++ % (more_io.size() + 1);
  return i == 0 ? io : *more_io[i - 1];
}

bool Relay::Blackholed() const {
  std::lock_guard<std::mutex> lock(faults_mutex);
  return Clock::now() >= blackhole_from;
}

bool Relay::Stalled(Clock::time_point t) const {
  std::lock_guard<std::mutex> lock(faults_mutex);
  return t >= stall_from && t < stall_until;
}

Clock::time_point Relay::StallUntil() const {
  std::lock_guard<std::mutex> lock(faults_mutex);
  return stall_until;
}

double Relay::Jitter() {
  std::lock_guard<std::mutex> lock(faults_mutex);
  return std::uniform_real_distribution<double>(0, link.jitter_seconds)(jitter_rng);
}

void Relay::Delivered(size_t n) {
  std::function<void()> strike;
  {
    std::lock_guard<std::mutex> lock(faults_mutex);
    if (fault_budget < 0) return;
    fault_budget -= static_cast<int64_t>(std::min<size_t>(n, static_cast<size_t>(fault_budget)));
    if (fault_budget != 0) return;
    fault_budget = -1;
    strike = std::move(fault);
  }
  strike();  // outside the lock: a stall takes it again
}

void Relay::Stall(Clock::time_point from, double seconds) {
  std::lock_guard<std::mutex> lock(faults_mutex);
  stall_from = from;
  stall_until = from + Seconds(seconds);
}

void Relay::ArmFault(uint64_t bytes, std::function<void()> action) {
  std::lock_guard<std::mutex> lock(faults_mutex);
  fault_budget = static_cast<int64_t>(std::max<uint64_t>(1, bytes));
  fault = std::move(action);
}

void Relay::CloseAll() {
  ++reset_count;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& c : connections) {
    if (auto connection = c.lock()) CloseOnItsThread(connection);
  }
}

bool Relay::Evictable(const RelayConnection& c, Clock::time_point now) const {
  if (c.closed) return false;
  if (c.down.bytes_read == 0 && now - c.accepted >= kEvictableAfter) return true;  // no byte from the upstream yet
  if (link.unauthenticated_seconds <= 0 || now - c.accepted < Seconds(link.unauthenticated_seconds)) return false;
  std::lock_guard<std::mutex> lock(names_mutex);
  if (c.upstream_path.empty()) return false;
  const auto peer = peers_by_path.find(c.upstream_path);
  return peer == peers_by_path.end() || !peer->second.authenticated;
}

bool Relay::EvictFor(const std::function<bool(const RelayConnection&)>& among) {
  const Clock::time_point now = Clock::now();
  if (now - eviction_window >= std::chrono::seconds(1)) {
    eviction_window = now;
    evictions_in_window = 0;
  }
  // Each eviction costs gRPC a socket until it sees the close, and gRPC 1.51's listener stops for
  // good when it runs out of them: at most max_connections (at least 8) a second.
  if (evictions_in_window >= std::max(8, link.max_connections)) return false;
  const auto oldest = std::find_if(connections.begin(), connections.end(), [&](const std::weak_ptr<RelayConnection>& c) {
    const auto open = c.lock();
    return open && among(*open) && Evictable(*open, now);
  });
  if (oldest == connections.end()) return false;
  ++evictions_in_window;
  ++refused;
  CloseOnItsThread(oldest->lock());
  connections.erase(oldest);
  return true;
}

bool Relay::TakeArrival(const std::string& address, Clock::time_point now) {
  const double rate = link.connections_per_second_per_address, burst = 2 * rate;
  const auto refilled = [&](const Arrivals& a) {
    return std::min(burst, a.tokens + rate * std::chrono::duration<double>(now - a.at).count());
  };
  if (arrivals.size() >= 4096) {  // forget the addresses whose buckets are full again
    for (auto it = arrivals.begin(); it != arrivals.end();) it = refilled(it->second) >= burst ? arrivals.erase(it) : std::next(it);
  }
  const auto [it, added] = arrivals.try_emplace(address, Arrivals{burst, now});
  Arrivals& a = it->second;
  a.tokens = refilled(a);
  a.at = now;
  if (a.tokens < 1) return false;
  a.tokens -= 1;
  return true;
}

bool Relay::Admit(const std::shared_ptr<RelayConnection>& connection) {
  boost::system::error_code ec;
  const Endpoint peer = connection->client.remote_endpoint(ec);
  if (ec) return false;
  const std::string address = PeerAddress(peer);
  std::lock_guard<std::mutex> lock(mutex);
  if (link.connections_per_second_per_address > 0 && !TakeArrival(address, Clock::now())) return false;
  connections.remove_if([](const std::weak_ptr<RelayConnection>& c) { return c.expired(); });
  if (link.max_connections_per_address > 0) {
    const auto from_peer = std::count_if(connections.begin(), connections.end(), [&](const std::weak_ptr<RelayConnection>& c) {
      const auto open = c.lock();
      return open && !open->closed && open->peer_address == address;
    });
    // The address's own idle connections make room first: one address cannot lock itself out.
    if (from_peer >= link.max_connections_per_address &&
        !EvictFor([&](const RelayConnection& c) { return c.peer_address == address; })) {
      return false;
    }
  }
  if (link.max_connections > 0 && connections.size() >= static_cast<size_t>(link.max_connections) &&
      !EvictFor([](const RelayConnection&) { return true; })) {
    return false;
  }
  connection->peer_address = address;
  connections.push_back(connection);
  return true;
}

void Relay::Accept() {
  auto connection = std::make_shared<RelayConnection>(*this, NextIo());
  acceptor.async_accept(connection->client, [this, connection](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;  // the relay is stopping
    if (ec) {  // out of file descriptors (EMFILE, ENFILE) or memory: pause, then listen on
      spdlog::warn("relay: accept failed ({}): retrying in 100 ms; raise the open-files limit or lower max_connections",
                   ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](boost::system::error_code wait) {
        if (!wait) Accept();
      });
      return;
    }
    if (!Admit(connection)) {
      ++refused;
      connection->Close();  // nothing of it has run on its thread yet
      return Accept();
    }
    asio::dispatch(connection->client.get_executor(), [this, connection] { Handshake(connection); });
    Accept();
  });
}

void Relay::Handshake(const std::shared_ptr<RelayConnection>& connection) {
  if (connection->closed) return;  // closed (evicted, the relay stopping) before its thread took it up
  if (!connection->tls) return ConnectUpstream(connection, {});
  connection->handshake_timer.expires_after(Seconds(link.tls_handshake_seconds));
  connection->handshake_timer.async_wait([connection](boost::system::error_code ec) {
    if (!ec) connection->Close();  // no handshake in time: the slot goes back
  });
  connection->tls->async_handshake(asio::ssl::stream_base::server, [this, connection](boost::system::error_code ec) {
    connection->handshake_timer.cancel();
    if (ec || connection->closed) return connection->Close();
    ConnectUpstream(connection, PeerCertificateNames(connection->tls->native_handle()));
  });
}

void Relay::ConnectUpstream(const std::shared_ptr<RelayConnection>& connection, std::vector<std::string> names) {
  if (!peer_folder.empty()) {
    const asio::local::stream_protocol::endpoint bound(peer_folder + "/peer-" + std::to_string(++peers_bound));
    boost::system::error_code ec;
    connection->upstream.open(asio::generic::stream_protocol(asio::local::stream_protocol()), ec);
    if (!ec) connection->upstream.bind(Endpoint(bound), ec);
    if (ec) {
      spdlog::warn("front door: cannot bind a connection's upstream end to {} ({}): check that folder's space and rights",
                   bound.path(), ec.message());
      return connection->Close();
    }
    std::lock_guard<std::mutex> lock(names_mutex);
    connection->upstream_path = bound.path();
    peers_by_path[bound.path()] = UpstreamPeer{std::move(names)};
  }
  connection->upstream.async_connect(upstream, [connection](boost::system::error_code ec) {
    // The upstream saw the bound path when it accepted; the file itself is no longer needed.
    if (!connection->upstream_path.empty()) ::unlink(connection->upstream_path.c_str());
    if (ec) return connection->Close();
    connection->Start();
  });
}

TcpRelay::TcpRelay(std::string upstream_host, uint16_t upstream_port, LinkOptions link, const std::string& listen)
    : impl_(std::make_unique<Impl>()) {
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(upstream_host, std::to_string(upstream_port), ec);
  // A name that does not exist stays so; a DNS server that did not answer may answer later.
  Require(!ec && !endpoints.empty(), ec == boost::asio::error::host_not_found ? ErrorCode::kFailedPrecondition : ErrorCode::kUnavailable,
          upstream_host + ":" + std::to_string(upstream_port) + ": cannot resolve the host name " + upstream_host + " (" +
              ec.message() + "): check the server address");
  impl_->upstream = endpoints.begin()->endpoint();
  Start(link, listen);
}

TcpRelay::TcpRelay(const UnixSocket& upstream, LinkOptions link, const std::string& listen)
    : impl_(std::make_unique<Impl>()) {
  Require(!upstream.path.empty() && upstream.path.size() < sizeof(sockaddr_un::sun_path), ErrorCode::kInvalidArgument,
          "the Unix socket path '" + upstream.path + "' must have 1 to " +
              std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " characters: choose a shorter directory");
  impl_->upstream = asio::local::stream_protocol::endpoint(upstream.path);
  if (!link.tls.cert.empty()) {
    impl_->peer_folder = std::filesystem::path(upstream.path).parent_path().string();
    if (impl_->peer_folder.empty()) impl_->peer_folder = ".";
  }
  Start(link, listen);
}

void TcpRelay::Start(const LinkOptions& link, const std::string& listen) {
  Require(link.up_bits_per_second >= 0 && link.down_bits_per_second >= 0 && link.latency_seconds >= 0 &&
              link.jitter_seconds >= 0 && link.stall_seconds >= 0 && link.burst_bytes > 0 && link.max_connections >= 0,
          ErrorCode::kInvalidArgument,
          "link rates, delays, the burst and max_connections must not be negative (0 rate or 0 connections: unlimited)");
  Require(link.threads >= 1 && link.threads <= 64, ErrorCode::kInvalidArgument,
          "the relay's threads must be 1 to 64, not " + std::to_string(link.threads) + ": about one per core that serves clients");
  Require(link.stream_frames_per_second >= 0 && link.tls_handshake_seconds > 0 && link.unauthenticated_seconds >= 0 &&
              link.connections_per_second_per_address >= 0,
          ErrorCode::kInvalidArgument,
          "stream_frames_per_second, unauthenticated_seconds and connections_per_second_per_address must not be "
          "negative (0: off) and the TLS handshake time must be positive");
  impl_->link = link;
  impl_->jitter_rng.seed(link.seed);
  if (!link.tls.cert.empty()) impl_->tls = ServerTlsContext(link.tls, true, "the front door " + listen);
  if (link.reset_after_bytes >= 0) {
    impl_->ArmFault(static_cast<uint64_t>(link.reset_after_bytes), [this] { impl_->CloseAll(); });
  }
  if (link.stall_at_seconds >= 0) {
    impl_->Stall(impl_->started + Seconds(link.stall_at_seconds), link.stall_seconds);
  }
  if (link.blackhole_at_seconds >= 0) impl_->blackhole_from = impl_->started + Seconds(link.blackhole_at_seconds);
  if (link.reset_at_seconds >= 0) {
    impl_->reset_timer.expires_at(impl_->started + Seconds(link.reset_at_seconds));
    impl_->reset_timer.async_wait([this](boost::system::error_code ec) {
      if (!ec) impl_->CloseAll();
    });
  }

  boost::system::error_code ec;
  const auto [listen_host, listen_port] = SplitHostPort(listen, "listen");
  const auto local_address = asio::ip::make_address(listen_host == "localhost" ? "127.0.0.1" : listen_host, ec);
  Require(!ec, ErrorCode::kInvalidArgument, "listen address '" + listen + "' is not an IP address: use e.g. 127.0.0.1:0");
  const tcp::endpoint local(local_address, listen_port);
  impl_->acceptor.open(local.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(local, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  Require(!ec, ErrorCode::kUnavailable, "cannot listen on " + listen + ": " + ec.message() + ": choose a free port");
  impl_->Accept();
  for (int i = 0; i < link.threads; ++i) {
    if (i > 0) {
      impl_->more_io.push_back(std::make_unique<asio::io_context>(1));
      impl_->keep_running.push_back(asio::make_work_guard(*impl_->more_io.back()));
    }
    asio::io_context& io = i == 0 ? impl_->io : *impl_->more_io.back();
    impl_->threads.emplace_back([&io, i] {
      pthread_setname_np(pthread_self(), ("relay-" + std::to_string(i)).c_str());  // as top -H and /proc show it
      io.run();
    });
  }
}

TcpRelay::~TcpRelay() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->reset_timer.cancel();
    impl_->accept_retry.cancel();
    impl_->CloseAll();
    impl_->keep_running.clear();  // the further threads stop once the closes queued on them have run
  });
  // With the acceptor, every socket and every timer closed, each pending handler completes with an
  // error and starts nothing new, so each thread's run() returns: nothing is destroyed under asio.
  for (std::thread& t : impl_->threads) t.join();
}

uint16_t TcpRelay::port() const { return impl_->acceptor.local_endpoint().port(); }
uint64_t TcpRelay::bytes_up() const { return impl_->up.load(); }
uint64_t TcpRelay::bytes_down() const { return impl_->down.load(); }
uint64_t TcpRelay::resets() const { return impl_->reset_count.load(); }
uint64_t TcpRelay::refused() const { return impl_->refused.load(); }
uint64_t TcpRelay::stream_floods() const { return impl_->stream_floods.load(); }

std::vector<std::string> TcpRelay::ClientCertificateNames(const std::string& upstream_peer_path) const {
  std::lock_guard<std::mutex> lock(impl_->names_mutex);
  const auto found = impl_->peers_by_path.find(upstream_peer_path);
  return found == impl_->peers_by_path.end() ? std::vector<std::string>{} : found->second.names;
}

void TcpRelay::MarkAuthenticated(const std::string& upstream_peer_path) {
  std::lock_guard<std::mutex> lock(impl_->names_mutex);
  const auto found = impl_->peers_by_path.find(upstream_peer_path);
  if (found != impl_->peers_by_path.end()) found->second.authenticated = true;
}

size_t TcpRelay::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return static_cast<size_t>(std::count_if(impl_->connections.begin(), impl_->connections.end(),
                                           [](const std::weak_ptr<RelayConnection>& c) { return !c.expired(); }));
}

void TcpRelay::ResetConnections() {
  asio::post(impl_->io, [this] { impl_->CloseAll(); });
}

void TcpRelay::ResetAfter(uint64_t more_bytes) {
  asio::post(impl_->io, [this, more_bytes] { impl_->ArmFault(more_bytes, [this] { impl_->CloseAll(); }); });
}

void TcpRelay::Stall(double seconds) {
  asio::post(impl_->io, [this, seconds] { impl_->Stall(Clock::now(), seconds); });
}

void TcpRelay::StallAfter(uint64_t more_bytes, double seconds) {
  asio::post(impl_->io, [this, more_bytes, seconds] {
    impl_->ArmFault(more_bytes, [this, seconds] { impl_->Stall(Clock::now(), seconds); });
  });
}

void TcpRelay::Blackhole(bool on) {
  asio::post(impl_->io, [this, on] {
    std::lock_guard<std::mutex> lock(impl_->faults_mutex);
    impl_->blackhole_from = on ? Clock::now() : Clock::time_point::max();
  });
}

}  // namespace amaq
