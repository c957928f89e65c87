// The gRPC face of a SplitServer (proto/amaq/v1/split_training.proto), on gRPC's callback API.
//
// Every call is authenticated first (TokenStore); a Join binds the token's client id to a session.
// Steps is one bidirectional stream per client: request chunks are reassembled by a StepAssembler
// (chunk counts, chunk sizes and the bytes of one step are bounded), complete steps go to the
// StepWorker's queue (server/step_worker.h), and replies are written back in chunks.
// A malformed step ends that client's stream with the error's status (the client reconnects);
// other clients are not affected. A client has one step stream at a time: a new one ends the
// older (ABORTED), so the memory one client can hold is one partial step. A stream that stalls in
// the middle of a step (no chunk received, or no reply chunk taken, for stall_timeout_seconds) is
// ended with DEADLINE_EXCEEDED and its buffers are freed; the client's session (step counter,
// LoRA) stays for its rejoin.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "amaq/v1/split_training.grpc.pb.h"
#include "server/step_assembler.h"
#include "server/step_worker.h"
#include "server/token_store.h"

namespace amaq::server {

class SplitServer;  // server/split_server.h: held by reference, so this header needs no LibTorch

// The defaults here are amaq-server's (server/server_config.cc declares the keys that set them).
// A replica set's state as /metrics shows it (server/replica_group.h, server/replica_sync.h).
struct ReplicaStatus {
  int rank = 0, replicas = 1;
  int64_t generation = 0;
  int64_t synchronisations = 0, synchronisation_failures = 0;  // of the shared LoRA
};

struct ServiceOptions {
  int max_chunk_bytes = 1 << 20;
  int max_chunks = 4096;
  double stall_timeout_seconds = 30;
  double connection_idle_seconds = 300;  // gRPC closes a connection with no call in flight this long
  std::string server_id = "amaq-server";
  BatchOptions batching;  // how the compute stage gathers the steps of several clients
  // Mutual TLS ended in front of gRPC (the server's front door): the names in the client
  // certificate behind a call's peer address (gRPC's peer(), e.g. "unix:/..."). Set, a call whose
  // peer has none is refused. Unset: only gRPC's own TLS authenticates certificates.
  std::function<std::vector<std::string>(const std::string& peer)> certificate_names_of;
  // Told the peer (gRPC's peer()) of each call that passed Authenticate: the front door then keeps
  // that connection's slot (an unauthenticated one is evicted for newcomers). Unset: not told.
  std::function<void(const std::string& peer)> authenticated_peer;
  // A replica set (server/placement.h): the host:port of the replica that serves `client_id`, or
  // empty when this one does. A Join of a client served elsewhere is answered with that address
  // (JoinReply.owner_address) and makes no session. Unset: this server serves every client.
  std::function<std::string(const std::string& client_id)> owner_of;
  // A replica set's state for /metrics; unset: no replica metrics.
  std::function<ReplicaStatus()> replica_status;
};

// A step stream the service watches for stalls (the Steps reactor).
class WatchedStream {
 public:
  virtual ~WatchedStream() = default;
  // Ends the stream when it has been stuck mid-step for longer than `timeout`.
  virtual void CheckStall(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration timeout) = 0;
  // Ends the stream (ABORTED): a newer stream of the same client replaced it.
  virtual void Supersede() = 0;
};

// Per-client traffic as the service sees it: serialized protobuf bytes of every message.
struct Traffic {
  uint64_t bytes_up = 0, bytes_down = 0;
  bool connected = false;
};

class SplitTrainingService final : public amaq::v1::SplitTraining::CallbackService {
 public:
  // `server` and `tokens` must outlive the service.
  SplitTrainingService(SplitServer& server, TokenStore& tokens, ServiceOptions options);
  ~SplitTrainingService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const amaq::v1::JoinRequest* request,
                                 amaq::v1::JoinReply* reply) override;
  grpc::ServerBidiReactor<amaq::v1::StepRequest, amaq::v1::StepReply>* Steps(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* SyncAdapters(grpc::CallbackServerContext* context, const amaq::v1::AdapterUpload* request,
                                         amaq::v1::AdapterAverage* reply) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context, const amaq::v1::StatusRequest* request,
                                   amaq::v1::StatusReply* reply) override;
  // The caller's own server-side LoRA (never another client's: the caller is the token's client),
  // in parts of at most max_chunk_bytes of values (ServerAdapterParts).
  grpc::ServerWriteReactor<amaq::v1::ServerAdapter>* FetchAdapter(grpc::CallbackServerContext* context,
                                                                  const amaq::v1::AdapterRequest* request) override;
  grpc::ServerUnaryReactor* ReportMetric(grpc::CallbackServerContext* context, const amaq::v1::MetricReport* request,
                                         amaq::v1::MetricAck* reply) override;

  // Drain: from now on a step that completes arriving, and a Join, are refused UNAVAILABLE (not
  // applied: the client sends the step again once a server is back); steps already submitted finish.
  void StopTakingSteps() { stopping_ = true; }
  bool taking_steps() const { return !stopping_; }

  StepWorker& worker() { return worker_; }
  const StepWorker& worker() const { return worker_; }
  // Watches a client's stream; a stream of the same client watched before is superseded.
  void Watch(WatchedStream* stream, const std::string& client);
  void Unwatch(WatchedStream* stream);
  size_t open_streams() const;
  std::map<std::string, Traffic> traffic() const;
  void CountTraffic(const std::string& client, uint64_t up, uint64_t down);
  void SetConnected(const std::string& client, bool connected);

  struct Caller {
    std::string client;
    bool admin = false;  // an operator's token (or no tokens at all): Status lists every client
  };
  // Whom a call acts as, or an UNAUTHENTICATED status; PERMISSION_DENIED when a mutual-TLS client
  // certificate is not issued to that client (its common name or a SAN must be the client id).
  grpc::Status Authenticate(const grpc::CallbackServerContext* context, Caller* caller);
  // Whom a bearer token belongs to (tokens_file), for the live view; nullopt when the server has no
  // tokens or the token is not (or no longer) valid.
  std::optional<Caller> CallerOfToken(const std::string& token);
  // Whether `token` still belongs to `client` (tokens are re-read when their file changes).
  bool StillAuthorized(const std::string& token, const std::string& client);
  static std::string TokenOf(const grpc::CallbackServerContext* context);

  SplitServer& server() { return server_; }
  const SplitServer& server() const { return server_; }
  const ServiceOptions& options() const { return options_; }
  const StepLimits& limits() const { return limits_; }

 private:
  SplitServer& server_;
  TokenStore& tokens_;
  ServiceOptions options_;
  StepLimits limits_;
  mutable std::mutex traffic_mutex_;
  std::map<std::string, Traffic> traffic_;
  // Recursive: a stream the watchdog ends may be unwatched (OnDone) on the watchdog's own thread.
  mutable std::recursive_mutex watch_mutex_;
  std::condition_variable_any watch_stop_;
  std::set<WatchedStream*> streams_;
  std::map<std::string, WatchedStream*> stream_of_;  // the one open step stream of each client
  bool stopping_watch_ = false;
  std::atomic<bool> stopping_{false};  // StopTakingSteps
  std::thread watchdog_;
  StepWorker worker_{server_, options_.batching};  // destroyed first: runs the steps still queued, then stops
};

// amaq::Error codes map one to one onto gRPC status codes (messages cut to 2 KiB); any other
// exception is logged with an id and reaches the client as INTERNAL with that id only.
grpc::Status ToStatus(const std::exception& e);

// The standard services every amaq gRPC server offers beside SplitTraining, so that generic probes
// and tools work: grpc.health.v1.Health (unauthenticated; SERVING from the moment the server is
// built, which is after the model is loaded and the checkpoint restored, NOT_SERVING once it starts
// to drain or shuts down) and server reflection. Call before creating the grpc::ServerBuilder.
void EnableStandardServices();

// What every amaq gRPC server sets: the largest message (a step chunk, or an adapter upload, and
// their fields), no message compression (nothing is inflated, before or after authentication),
// a TLS handshake that must finish within 10 s, and a connection with no call in flight for
// connection_idle_seconds closed.
void HardenServerBuilder(grpc::ServerBuilder& builder, const SplitTrainingService& service);

}  // namespace amaq::server
