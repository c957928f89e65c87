// amaq-server: serves the layers [cut, L) of a model to split-training clients over gRPC with TLS.
// Settings: --config server.yaml and/or --key value flags (docs/configuration.md). SIGINT/SIGTERM
// drain the steps in flight, write a checkpoint and exit.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <map>
#include <thread>

#include "common/base/config.h"
#include "common/base/error.h"
#include "common/base/program.h"
#include "common/net/tcp_relay.h"
#include "common/model/threads.h"
#include "common/net/tls_files.h"
#include "server/grpc_service.h"
#include "server/inner_socket.h"
#include "server/server_config.h"
#include "server/live_view.h"
#include "server/metrics_http.h"
#include "server/prometheus_text.h"
#include "server/replica_sync.h"
#include "server/split_server.h"
#include "server/token_store.h"

using namespace amaq;

namespace {

// File descriptors kept free of connections (model files, checkpoints, gRPC's own), and those
// one client connection holds: its socket and the relay's loopback pair.
constexpr int64_t kReservedFiles = 128;
constexpr int64_t kFilesPerConnection = 3;

// The first line of `path`, which must hold a token of 16 or more characters.
std::string ReadMetricsToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  Require(in && std::getline(in, token), ErrorCode::kNotFound, path + ": cannot read the metrics token file: create it with one line, the token");
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  Require(token.size() >= 16, ErrorCode::kInvalidArgument,
          path + ": the metrics token has " + std::to_string(token.size()) + " characters: use 16 or more (e.g. openssl rand -hex 24)");
  return token;
}

// The /metrics page and the live view on metrics_listen (null when it is empty); they answer
// not ready once `draining` is set.
std::unique_ptr<server::MetricsHttp> StartMetrics(const Config& c, server::SplitTrainingService& service,
                                                  const std::string& token, const std::atomic<bool>& draining) {
  if (c.String("metrics_listen").empty()) return nullptr;
  server::MetricsOptions m;
  m.listen = c.String("metrics_listen");
  m.token = token;
  m.open_pages = c.Bool("metrics_public");
  m.viewer_of = server::LiveViewers(service);
  if (c.Bool("metrics_tls")) {
    Require(!c.String("tls_cert").empty() && !c.String("tls_key").empty(), ErrorCode::kInvalidArgument,
            "metrics_tls serves HTTPS with the server's certificate: set tls_cert and tls_key (or metrics_tls: false)");
    m.tls_cert = c.String("tls_cert");
    m.tls_key = c.String("tls_key");
  }
  std::map<std::string, server::HttpPage> pages = server::LiveViewPages(service);
  pages["/metrics"] = {"text/plain; version=0.0.4", [&service](const server::Viewer&) { return server::PrometheusText(service); }};
  auto metrics = std::make_unique<server::MetricsHttp>(m, std::move(pages), [&draining] { return !draining; });
  const char* scheme = m.tls_cert.empty() ? "http" : "https";
  spdlog::info("metrics on {0}://{1}/metrics, live view on {0}://{1}/{2} (port {3})", scheme, m.listen,
               m.token.empty() ? "" : "#token=<metrics token>", metrics->port());
  return metrics;
}

// With replicas > 1 the servers of one run meet first (server/replica_group.h); with a shared
// LoRA they then average it on a schedule (server/replica_sync.h). Both null for one server.
struct Replicas {
  std::unique_ptr<server::ReplicaGroup> group;
  std::unique_ptr<server::ReplicaSync> sync;  // stops before the group goes
};

Replicas JoinReplicas(const Config& c, server::SplitServer& split, const server::ServerOptions& o) {
  Replicas replicas;
  const server::ReplicaOptions options = server::ReplicaOptionsFrom(c);
  if (options.replicas == 1) return replicas;
  spdlog::info("replica {} of {}: waiting for the replica set at {}", options.rank, options.replicas, options.rendezvous);
  replicas.group = server::ReplicaGroup::Join(options, server::IdentityOf(split, o));
  if (o.shared_lora) replicas.sync = std::make_unique<server::ReplicaSync>(split, *replicas.group, c.Double("replica_sync_seconds"));
  return replicas;
}

// A replica's service sends the clients other replicas own to them and shows the set on /metrics.
void ServeAsReplica(const Replicas& replicas, server::ServiceOptions& service) {
  service.owner_of = [&replicas](const std::string& client_id) { return replicas.group->OwnerAddress(client_id); };
  service.replica_status = [&replicas] {
    server::ReplicaStatus status{replicas.group->rank(), replicas.group->size(), replicas.group->generation(), 0, 0};
    if (replicas.sync) {
      status.synchronisations = replicas.sync->synchronisations();
      status.synchronisation_failures = replicas.sync->failures();
    }
    return status;
  };
}

int Run(const Config& c) {
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  const server::ServerOptions o = server::ServerOptionsFrom(c);
  // The files the configuration names are read before the server writes anything (checkpoint_dir).
  if (c.String("tokens_file").empty()) spdlog::warn("no tokens_file: every client is accepted as the id it claims");
  if (c.Bool("insecure")) spdlog::warn("insecure: true: gRPC runs in plain text (tests only)");
  server::TokenStore tokens(c.String("tokens_file"));
  const TlsFiles tls{c.String("tls_cert"), c.String("tls_key"), c.String("tls_client_ca")};
  Require(c.Bool("insecure") || (!tls.cert.empty() && !tls.key.empty()), ErrorCode::kInvalidArgument,
          "the server needs tls_cert and tls_key (or insecure: true for tests only)");
  const std::string metrics_token = c.String("metrics_token_file").empty() ? "" : ReadMetricsToken(c.String("metrics_token_file"));
  server::SplitServer split(o);
  const Replicas replicas = JoinReplicas(c, split, o);
  // gRPC listens in plain text on a private Unix socket behind a front door (a TcpRelay on
  // `listen`) that ends TLS, bounds the connections open at once, keeps accepting when file
  // descriptors run out (gRPC 1.51's own listener stops for good after one failed accept), closes a
  // connection that opens or resets HTTP/2 streams too fast (gRPC 1.51 queues a call for each) and,
  // with mutual TLS, tells the service whose certificate stands behind each connection; no other
  // local user reaches gRPC around it (docs/reliability.md).
  std::unique_ptr<TcpRelay> front_door;
  server::ServiceOptions service_options = server::ServiceOptionsFrom(c);
  if (!tls.ca.empty() && !c.Bool("insecure")) {
    service_options.certificate_names_of = [&front_door](const std::string& peer) {
      const std::string unix_prefix = "unix:";
      return front_door && peer.rfind(unix_prefix, 0) == 0 ? front_door->ClientCertificateNames(peer.substr(unix_prefix.size()))
                                             : std::vector<std::string>{};
    };
  }
  service_options.authenticated_peer = [&front_door](const std::string& peer) {
    const std::string unix_prefix = "unix:";
    if (front_door && peer.rfind(unix_prefix, 0) == 0) front_door->MarkAuthenticated(peer.substr(unix_prefix.size()));
  };
  if (replicas.group) ServeAsReplica(replicas, service_options);
  server::SplitTrainingService service(split, tokens, service_options);

  const uint64_t open_files = RaiseOpenFilesLimit();
  const int64_t connection_room = (static_cast<int64_t>(open_files) - kReservedFiles) / kFilesPerConnection;
  Require(connection_room >= 8, ErrorCode::kFailedPrecondition,
          "the open-files limit is " + std::to_string(open_files) + ", room for " + std::to_string(connection_room) +
              " connections: raise it (ulimit -n 4096, or LimitNOFILE= in the service unit)");
  LinkOptions front;
  front.max_connections = static_cast<int>(std::min<int64_t>(c.Int("max_connections"), connection_room));
  front.max_connections_per_address = static_cast<int>(c.Int("max_connections_per_address"));
  front.unauthenticated_seconds = c.Double("unauthenticated_seconds");
  front.connections_per_second_per_address = c.Double("connections_per_second_per_address");
  front.threads = c.Int("front_door_threads") > 0 ? static_cast<int>(c.Int("front_door_threads"))
                                                  : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8);
  front.close_with_upstream = true;  // gRPC gave up on it (handshake timeout, idle): the slot is free
  if (!c.Bool("insecure")) front.tls = tls;
  front.stream_frames_per_second = c.Double("stream_frames_per_second");
  front.stream_frame_burst = static_cast<double>(c.Int("stream_frame_burst"));
  server::EnableStandardServices();
  grpc::ServerBuilder builder;
  const server::InnerSocket inner;
  int inner_port = 0;  // gRPC sets it to 1 for a Unix socket it listens on
  builder.AddListeningPort(inner.grpc_address(), grpc::InsecureServerCredentials(), &inner_port);
  server::HardenServerBuilder(builder, service);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  Require(grpc_server != nullptr && inner_port > 0, ErrorCode::kUnavailable,
          "gRPC cannot listen on " + inner.path() + ": is its directory writable (TMPDIR)?");
  front_door = std::make_unique<TcpRelay>(UnixSocket{inner.path()}, front, c.String("listen"));
  const int port = front_door->port();
  spdlog::info("at most {} client connections at once (max_connections {}, open-files limit {}), on {} front door threads",
               front.max_connections, c.Int("max_connections"), open_files, front.threads);
  if (!c.String("port_file").empty()) std::ofstream(c.String("port_file")) << port << "\n";
  std::atomic<bool> draining{false};
  const std::unique_ptr<server::MetricsHttp> metrics = StartMetrics(c, service, metrics_token, draining);
  spdlog::info("amaq-server listening on port {} ({})", port, c.Bool("insecure") ? "plain text" : "TLS");

  const int received = WaitForStopSignal();
  spdlog::info("signal {}: taking no new steps, finishing those in flight", received);
  service.StopTakingSteps();
  draining = true;  // /readyz and the gRPC health service say NOT_SERVING from here on
  grpc_server->GetHealthCheckService()->SetServingStatus(false);
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  split.Checkpoint();
  spdlog::info("stopped{}", o.checkpoint_dir.empty() ? "" : "; checkpoint written to " + o.checkpoint_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BlockStopSignals();  // taken by WaitForStopSignal in Run
  Config config = server::ServerConfig();
  return RunProgram(config, argc, argv, Run, server::CheckServerConfig);
}
