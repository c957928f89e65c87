// A TLS handshake flood from many addresses beside a legitimate client (issue 58 item 4): one
// amaq-server process per front_door_threads setting (1, 2, ...), attackers on 64 loopback
// addresses (127.0.1.1-64, each within connections_per_second_per_address) that send a recorded
// TLS 1.3 ClientHello and wait for the server's first flight (the server's key exchange and
// signature: its costly half of a handshake; the attacker's is a connect and a write), and one
// client that joins every 250 ms over a fresh channel (a full TLS handshake, then Join). Reports
// the Join latency (p50, p90, max) and failures with and without the flood, the server flights the
// attackers got a second, and the CPU share of each front door thread (relay-N, /proc).
//   bench_handshake_flood [SERVER_BINARY] [MODEL_DIR] [SECONDS] [THREAD COUNTS, e.g. 1,2] [ATTACKERS]
//   (defaults: build/bin/amaq-server models/amaq-base 10 1,2 32)
#include <openssl/ssl.h>

#include <boost/asio.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/grpc_transport.h"
#include "client/split_client.h"
#include "common/text/datasets.h"
#include "common/model/threads.h"
#include "process.h"

using namespace amaq;
namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// The first flight a TLS 1.3 client sends (its ClientHello with an X25519 key share), recorded
// once through memory BIOs; the server does its half of the handshake for every copy it reads.
std::string RecordedClientHello() {
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(context);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  SSL_set_tlsext_host_name(ssl, "localhost");
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_set_alpn_protos(ssl, kAlpn, sizeof(kAlpn));
  SSL_do_handshake(ssl);  // wants to read the server's answer: the ClientHello is in `out`
  char* bytes = nullptr;
  const long n = BIO_get_mem_data(out, &bytes);
  std::string hello(bytes, static_cast<size_t>(n));
  SSL_free(ssl);
  SSL_CTX_free(context);
  return hello;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct JoinTimes {
  std::vector<double> ms;
  int failed = 0;
};

// Joins as "legit" over a fresh channel every 250 ms until `until`.
JoinTimes JoinRepeatedly(const client::GrpcOptions& g, const std::string& model, const Dataset& data, Clock::time_point until) {
  JoinTimes times;
  client::ClientOptions o;
  o.client_id = "legit";
  o.model_dir = model;
  o.method = "bf16";
  o.steps = 1;
  o.max_tokens = 256;
  o.progress = false;
  while (Clock::now() < until) {
    const auto next = Clock::now() + std::chrono::milliseconds(250);
    try {
      client::GrpcTransport transport(g);
      client::SplitClient c(o, data, transport);
      const auto start = Clock::now();
      c.Join();
      times.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    } catch (const std::exception& e) {
      if (times.failed++ == 0) std::fprintf(stderr, "a legitimate Join failed: %s\n", e.what());
    }
    std::this_thread::sleep_until(next);
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string server_binary = argc > 1 ? argv[1] : "build/bin/amaq-server";
  const std::string model = argc > 2 ? argv[2] : "models/amaq-base";
  const double seconds = argc > 3 ? std::stod(argv[3]) : 10;
  std::vector<int> thread_counts;
  std::istringstream counts(argc > 4 ? argv[4] : "1,2");
  for (std::string c; std::getline(counts, c, ',');) thread_counts.push_back(std::stoi(c));
  SetComputeThreads(1);
  const std::string work = (std::filesystem::temp_directory_path() / "amaq-bench-handshake-flood").string();
  std::filesystem::remove_all(work);
  if (std::system(("scripts/make-certs " + work + " >/dev/null").c_str()) != 0) return 1;
  Dataset data = LoadWordNetTopics("data");
  data.train.resize(64);  // the client is made again for every Join: little to tokenize
  const std::string hello = RecordedClientHello();
  const int kAttackers = argc > 5 ? std::stoi(argv[5]) : 32;
  constexpr int kAddresses = 64;

  std::printf("handshake flood: %d attacker threads over %d addresses (a recorded ClientHello, wait for the server's "
              "first flight), %.0f s per row; a client joins every 250 ms over a fresh TLS channel; %u cores\n",
              kAttackers, kAddresses, seconds, std::thread::hardware_concurrency());
  std::printf("%8s %-6s %6s %8s %8s %8s %7s %10s %s\n", "threads", "flood", "joins", "p50 ms", "p90 ms", "max ms", "failed",
              "flights/s", "front door threads' CPU");
  for (const int threads : thread_counts) {
    const std::string port_file = work + "/port";
    std::filesystem::remove(port_file);
    testing::Process server({server_binary, "--model", model, "--listen", "127.0.0.1:0", "--port_file", port_file,
                             "--tls_cert", work + "/server.pem", "--tls_key", work + "/server.key", "--threads", "1",
                             "--front_door_threads", std::to_string(threads), "--log_level", "warn"},
                            work + "/server.log");
    const int port = testing::WaitForPortFile(port_file, 120);
    if (port == 0) {
      std::fprintf(stderr, "bench_handshake_flood: the server did not start:\n%s\n", server.Log().c_str());
      return 1;
    }
    client::GrpcOptions g;
    g.server = "127.0.0.1:" + std::to_string(port);
    g.server_name = "localhost";
    g.tls.ca = work + "/ca.pem";
    g.call_timeout_seconds = 5;
    for (const bool flood : {false, true}) {
      std::atomic<bool> stop{false};
      std::atomic<int64_t> flights{0};
      std::vector<std::thread> attackers;
      for (int a = 0; flood && a < kAttackers; ++a) {
        attackers.emplace_back([&, a] {
          asio::io_context io;
          for (int k = a; !stop; k += kAttackers) {
            tcp::socket s(io);
            boost::system::error_code ec;
            s.open(tcp::v4());
            const std::string source = "127.0.1." + std::to_string(1 + k % kAddresses);
            s.bind(tcp::endpoint(asio::ip::make_address(source), 0), ec);
            if (!ec) s.connect(tcp::endpoint(asio::ip::address_v4::loopback(), static_cast<uint16_t>(port)), ec);
            if (!ec) asio::write(s, asio::buffer(hello), ec);
            char first = 0;
            if (!ec && s.read_some(asio::buffer(&first, 1), ec) == 1) ++flights;
          }
        });
      }
      const auto cpu_before = testing::ThreadCpuSeconds(server.pid(), "relay-");
      const auto start = Clock::now();
      const JoinTimes joins = JoinRepeatedly(g, model, data, start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const auto cpu_after = testing::ThreadCpuSeconds(server.pid(), "relay-");
      stop = true;
      for (std::thread& t : attackers) t.join();
      std::printf("%8d %-6s %6zu %8.1f %8.1f %8.1f %7d %10.0f %s\n", threads, flood ? "yes" : "no", joins.ms.size(),
                  Percentile(joins.ms, 0.5), Percentile(joins.ms, 0.9), joins.ms.empty() ? 0 : *std::max_element(joins.ms.begin(), joins.ms.end()),
                  joins.failed, static_cast<double>(flights) / elapsed,
                  testing::ThreadCpuShares(cpu_before, cpu_after, elapsed).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
