// GrpcTransport: a client's Transport over gRPC with TLS (client/transport.h). Steps travel on one
// bidirectional stream, chunked below max_chunk_bytes; its requests are written by a thread of
// their own, so that steps sent ahead (Send) never wait for the replies to be read, nor the other
// way round. A broken stream throws amaq::Error (kUnavailable) and the next Join opens a fresh
// one. With `meter` on (the default) the channel runs through a local TcpRelay, so
// bytes_up/bytes_down are the bytes that crossed the socket (to every server joined). A Join
// answered with owner_address (a replica set, docs/protocol.md "Replicas") moves the transport to
// that replica for good, and joins there.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "amaq/v1/split_training.grpc.pb.h"
#include "client/transport.h"
#include "common/base/error.h"
#include "common/net/tcp_relay.h"
#include "common/net/tls.h"

namespace amaq::client {

class StepWriter;  // grpc_transport.cc

struct GrpcOptions {
  std::string server = "localhost:50051";
  TlsFiles tls;
  bool insecure = false;
  std::string server_name;  // TLS name to verify when it differs from the host in `server`
  std::string token;        // bearer token
  bool meter = true;
  double call_timeout_seconds = 60;
  // Before the first successful Join: how long host:port may refuse connections (nothing listens
  // there) before Join gives up with kFailedPrecondition; until then it is kUnavailable (a server
  // still starting). After a Join, a refusal is a restart: kUnavailable, retried.
  double refused_seconds = 20;
};

class GrpcTransport : public Transport {
 public:
  explicit GrpcTransport(GrpcOptions options);
  ~GrpcTransport() override;
  int64_t Join(const JoinInfo& info) override;
  StepResult Step(const StepInput& input) override;
  void Send(const StepInput& input) override;
  StepResult Receive() override;
  NamedFloats SyncAdapters(const NamedFloats& adapter) override;
  ServerAdapterInfo FetchAdapter() override;
  void ReportMetric(int64_t step, const std::string& name, double value) override;
  bool server_decodes_with_cache() const override { return server_decode_cache_; }
  bool server_takes_micro_batches() const override { return server_micro_batches_; }
  bool server_scores_targets() const override { return server_score_targets_; }
  bool over_network() const override { return true; }
  std::string server() const override { return server_; }
  uint64_t bytes_up() const override;
  uint64_t bytes_down() const override;
  // The relay in front of the channel (null without metering): tests use it to break the link.
  TcpRelay* relay() { return relay_.get(); }

 private:
  void Authorize(grpc::ClientContext* context) const;
  void AuthorizeCall(grpc::ClientContext* context) const;  // a unary call: also its deadline
  // `failed` with the local byte meter in gRPC's text replaced by the server as given (the
  // meter's loopback address means nothing to a user); ServerError: that as amaq::Error naming `what`.
  grpc::Status NamedAsGiven(const grpc::Status& failed) const;
  Error ServerError(const grpc::Status& failed, const std::string& what) const;
  // The error a failed Join raises: a permanent TLS fault, a port nothing listens on, or the
  // status, each naming the server as given (client/connection_faults.h).
  Error JoinError(const grpc::Status& failed);
  // One authorized unary call `rpc(context)` of `request` and *reply, counting their bytes; throws
  // the status as amaq::Error naming `what`.
  template <typename Request, typename Reply, typename Rpc>
  void Unary(const std::string& what, const Request& request, Reply* reply, Rpc rpc);
  // Points the channel (and the byte meter) at server_, verifying `tls_name` (empty: server_'s host).
  void Target(const std::string& tls_name);
  void Connect();  // a fresh channel to target_
  // A replica answered that `owner` serves this client (JoinReply.owner_address): the next Join
  // goes there. kFailedPrecondition, naming the path, for an owner already `visited` or after
  // kMaxRedirects hops.
  void FollowOwner(const std::string& owner, std::vector<std::string>* visited);
  static constexpr size_t kMaxRedirects = 8;
  void OpenStream();
  void CloseStream();  // cancels the stream, then EndStream
  // Stops the writer, finishes the stream and forgets the steps in flight; returns its status.
  grpc::Status EndStream();

  GrpcOptions options_;
  std::string server_;  // the server joined (options_.server, or the replica it sent this client to)
  std::string host_, tls_name_;
  uint16_t port_ = 0;
  bool joined_ = false;  // a Join has succeeded
  std::optional<std::chrono::steady_clock::time_point> refused_since_;  // first refusal before joined_
  std::string client_id_;
  std::unique_ptr<TcpRelay> relay_;
  std::string target_;
  grpc::ChannelArguments channel_args_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<amaq::v1::SplitTraining::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<grpc::ClientReaderWriter<amaq::v1::StepRequest, amaq::v1::StepReply>> stream_;
  std::unique_ptr<StepWriter> writer_;  // of stream_'s requests
  std::deque<int64_t> in_flight_;       // ids of the steps sent and not yet answered, oldest first
  int max_chunk_bytes_ = 1 << 20;
  bool server_decode_cache_ = false;  // from the last JoinReply (older servers: false)
  bool server_micro_batches_ = false; // from the last JoinReply (older servers: false)
  bool server_score_targets_ = false; // from the last JoinReply (older servers: false)
  uint64_t message_up_ = 0, message_down_ = 0;  // gRPC messages' bytes (FramedBytes), when not metering
  uint64_t metered_up_ = 0, metered_down_ = 0;  // bytes of the meters of servers left behind
};

}  // namespace amaq::client
