#include "server/grpc_service.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "common/base/error.h"
#include "proto/grpc_status.h"
#include "proto/step_messages.h"
#include "server/split_server.h"

namespace amaq::server {
namespace {

using amaq::v1::StepReply;
using amaq::v1::StepRequest;

// What a draining server answers a new step or Join.
grpc::Status StoppingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the server is stopping (it writes its checkpoint): reconnect and send the step again once it is back");
}

// One client's step stream: reassembles request chunks, submits each step to the service's
// StepWorker, and writes the reply in chunks, one step after another. gRPC calls its methods from
// its own threads, the worker from its thread, and the watchdog or a newer stream of the same
// client may end it from another: every operation on the stream takes mutex_. A stream is never
// finished while its step is queued (the queued step points at it): an end asked for meanwhile is
// carried out when the step is done.
class StepsReactor : public grpc::ServerBidiReactor<StepRequest, StepReply>, public WatchedStream, public StepSink {
 public:
  StepsReactor(SplitTrainingService& service, std::string client, std::string token)
      : service_(service), client_(std::move(client)), token_(std::move(token)), assembler_(service.limits()) {
    service_.SetConnected(client_, true);
    service_.Watch(this, client_);
    Read();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK);  // the client closed its side
    service_.CountTraffic(client_, request_.ByteSizeLong(), 0);
    received_ += request_.payload().size();
    step_id_ = request_.step_id();
    bool complete = false;
    try {
      complete = assembler_.Add(request_);
    } catch (const std::exception& e) {
      spdlog::warn("client {}: malformed step stream: {}", client_, e.what());
      return End(ToStatus(e));
    }
    if (!complete) {
      Progress(Phase::kReceiving);
      return Read();
    }
    if (!service_.taking_steps()) return End(StoppingStatus());
    if (!service_.StillAuthorized(token_, client_)) {  // revoked while the stream was open
      return End(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                              "the token of client '" + client_ + "' was revoked: ask the server's operator for a new one"));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finished_) return;
      Progress(Phase::kComputing);
    }
    service_.worker().Submit(QueuedStep{client_, assembler_.Take(), this});
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    Progress(Phase::kReplying);
    WriteNext();
  }

  void OnDone() override {
    service_.Unwatch(this);
    service_.SetConnected(client_, false);
    const size_t received = received_;
    delete this;
    ReturnMemoryAfter(received);  // whatever of it the stream held is free now
  }

  void CheckStall(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration timeout) override {
    const Phase phase = phase_.load();
    if ((phase != Phase::kReceiving && phase != Phase::kReplying) || now - last_progress_.load() < timeout) return;
    const std::string step = std::to_string(step_id_.load());
    const std::string what = phase == Phase::kReceiving ? "sent part of step " + step : "stopped reading the reply to step " + step;
    spdlog::warn("client {} {} and stalled: closing its stream", client_, what);
    End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                     "the client " + what + " and then nothing for " +
                         std::to_string(std::chrono::duration<double>(timeout).count()) +
                         " s (the server's stall_timeout_seconds): rejoin and send the step again"));
  }

  void Supersede() override {
    spdlog::warn("client {} opened another step stream: closing the older one", client_);
    End(grpc::Status(grpc::StatusCode::ABORTED, "client '" + client_ +
                                                    "' opened another step stream, which replaces this one: run each "
                                                    "client id in one process only"));
  }

 private:
  enum class Phase { kIdle, kReceiving, kComputing, kReplying };

  void Progress(Phase phase) {
    last_progress_ = std::chrono::steady_clock::now();
    phase_ = phase;
  }

  void StepFailed(int64_t step_id, const std::exception& e) override {
    spdlog::warn("client {}: step {} refused: {}", client_, step_id, e.what());
    Progress(Phase::kIdle);
    End(ToStatus(e));
  }

  void StepDone(StepResult result) override {
    replies_ = StepReplies(result, static_cast<size_t>(service_.options().max_chunk_bytes));
    for (const StepReply& reply : replies_) service_.CountTraffic(client_, 0, reply.ByteSizeLong());
    next_reply_ = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Progress(Phase::kReplying);
      if (deferred_end_) return FinishLocked(*deferred_end_);
    }
    WriteNext();
  }

  void WriteNext() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    if (next_reply_ < replies_.size()) {
      StartWrite(&replies_[next_reply_++]);
    } else {
      phase_ = Phase::kIdle;
      StartRead(&request_);
    }
  }

  void Read() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finished_) StartRead(&request_);
  }

  void End(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ == Phase::kComputing) {  // the queued step points at `this`: end when it is done
      if (!deferred_end_) deferred_end_ = status;
      return;
    }
    FinishLocked(status);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    phase_ = Phase::kIdle;
    Finish(status);
  }

  SplitTrainingService& service_;
  std::string client_;
  std::string token_;  // checked again before every step: a revocation ends the stream
  StepAssembler assembler_;
  StepRequest request_;
  std::vector<StepReply> replies_;
  size_t next_reply_ = 0;
  std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<int64_t> step_id_{0};
  std::atomic<std::chrono::steady_clock::time_point> last_progress_{std::chrono::steady_clock::now()};
  std::mutex mutex_;
  bool finished_ = false;
  size_t received_ = 0;  // payload bytes over the stream's life
  std::optional<grpc::Status> deferred_end_;  // an end asked for while the step was computing
};

// Writes the parts of a stream one after the other, then finishes with OK (or with `status` at
// once, writing nothing). Deletes itself when gRPC is done with it.
class PartsWriter final : public grpc::ServerWriteReactor<amaq::v1::ServerAdapter> {
 public:
  PartsWriter(std::vector<amaq::v1::ServerAdapter> parts, const grpc::Status& status) : parts_(std::move(parts)) {
    if (status.ok() && !parts_.empty()) {
      StartWrite(&parts_.front());
    } else {
      Finish(status);
    }
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    if (++next_ == parts_.size()) return Finish(grpc::Status::OK);
    StartWrite(&parts_[next_]);
  }
  void OnDone() override { delete this; }

 private:
  std::vector<amaq::v1::ServerAdapter> parts_;
  size_t next_ = 0;
};

// A unary reactor that finishes at once with `status`.
grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::Status ToStatus(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return grpc::Status(StatusCodeOf(error->code()), Excerpt(error->what(), 2048));
  // Anything else is a bug or a library's failure (LibTorch's carry stack traces): it stays in the
  // server's log, and the client gets an id to quote.
  const std::string id = fmt::format("{:016x}", (uint64_t{std::random_device{}()} << 32) | std::random_device{}());
  spdlog::error("internal error {}: {}", id, e.what());
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "internal error " + id + " on the server: its operator finds the cause under that id in the server's log");
}

void EnableStandardServices() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
}

void HardenServerBuilder(grpc::ServerBuilder& builder, const SplitTrainingService& service) {
  const uint64_t largest = std::max<uint64_t>(static_cast<uint64_t>(service.options().max_chunk_bytes), service.server().adapter_bytes());
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<uint64_t>(largest + (1 << 20), INT32_MAX)));
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(std::min(service.options().connection_idle_seconds * 1000, 2e9)));
}

SplitTrainingService::SplitTrainingService(SplitServer& server, TokenStore& tokens, ServiceOptions options)
    : server_(server), tokens_(tokens), options_(std::move(options)) {
  limits_.max_chunk_bytes = options_.max_chunk_bytes;
  limits_.max_chunks = options_.max_chunks;
  limits_.shape = server_.step_limits();
  // fp32 of the largest batch, plus room for the codec's scales and bits tables.
  limits_.max_step_bytes = static_cast<uint64_t>(limits_.shape.max_batch_tokens) * server_.config().hidden_size * 4 + (1 << 20);
  watchdog_ = std::thread([this] {
    const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options_.stall_timeout_seconds));
    const auto period = std::min<std::chrono::steady_clock::duration>(timeout / 4, std::chrono::seconds(1));
    std::unique_lock<std::recursive_mutex> lock(watch_mutex_);
    while (!watch_stop_.wait_for(lock, period, [this] { return stopping_watch_; })) {
      const std::set<WatchedStream*> watched = streams_;  // CheckStall may unwatch a stream
      for (WatchedStream* stream : watched) {
        if (streams_.count(stream)) stream->CheckStall(std::chrono::steady_clock::now(), timeout);
      }
      std::set<std::string> connected;
      for (const auto& [client, stream] : stream_of_) connected.insert(client);
      lock.unlock();  // eviction writes files: streams come and go meanwhile
      try {
        server_.EvictIdle(connected);
      } catch (const std::exception& e) {
        spdlog::error("evicting idle sessions failed (they stay in memory; retrying): {}", e.what());
      }
      lock.lock();
    }
  });
}

SplitTrainingService::~SplitTrainingService() {
  {
    std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
    stopping_watch_ = true;
  }
  watch_stop_.notify_all();
  watchdog_.join();
}

void SplitTrainingService::Watch(WatchedStream* stream, const std::string& client) {
  std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
  streams_.insert(stream);
  WatchedStream*& current = stream_of_[client];
  WatchedStream* older = current;
  current = stream;
  if (older != nullptr) older->Supersede();  // one stream per client: the newest wins
}

void SplitTrainingService::Unwatch(WatchedStream* stream) {
  std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
  streams_.erase(stream);
  for (auto it = stream_of_.begin(); it != stream_of_.end(); ++it) {
    if (it->second == stream) {
      stream_of_.erase(it);
      break;
    }
  }
}

size_t SplitTrainingService::open_streams() const {
  std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
  return streams_.size();
}

std::string SplitTrainingService::TokenOf(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  const std::string header = it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
  return header.rfind("Bearer ", 0) == 0 ? header.substr(7) : "";
}

std::optional<SplitTrainingService::Caller> SplitTrainingService::CallerOfToken(const std::string& token) {
  if (!tokens_.enabled()) return std::nullopt;
  const std::optional<TokenStore::Owner> owner = tokens_.OwnerOf(token);
  if (!owner) return std::nullopt;
  return Caller{owner->client, owner->admin};
}

bool SplitTrainingService::StillAuthorized(const std::string& token, const std::string& client) {
  if (!tokens_.enabled()) return true;
  const auto owner = tokens_.OwnerOf(token);
  return owner && owner->client == client;
}

namespace {

// With mutual TLS, the identities of the client's certificate (common name, subject alternative
// names), from gRPC's TLS or else from the front door that ended it; empty when the peer presented
// none.
std::vector<std::string> CertificateIdentities(const grpc::CallbackServerContext* context, const ServiceOptions& options) {
  std::vector<std::string> names;
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) {
    return options.certificate_names_of ? options.certificate_names_of(context->peer()) : names;
  }
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) names.emplace_back(value.data(), value.size());
  }
  return names;
}

}  // namespace

grpc::Status SplitTrainingService::Authenticate(const grpc::CallbackServerContext* context, Caller* caller) {
  const auto& metadata = context->client_metadata();
  const std::string token = TokenOf(context);
  if (!tokens_.enabled()) {
    const auto claimed = metadata.find("x-amaq-client");
    caller->client = claimed == metadata.end() ? "" : std::string(claimed->second.data(), claimed->second.size());
    caller->admin = true;  // no tokens: a trusted network (tests), every caller sees everything
  } else {
    const std::optional<TokenStore::Owner> owner = tokens_.OwnerOf(token);
    if (!owner) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          token.empty() ? "no bearer token: set the client's token (authorization: Bearer <token>)"
                                        : "unknown or revoked token: ask the server's operator for a valid one");
    }
    caller->client = owner->client;
    caller->admin = owner->admin;
  }
  const std::vector<std::string> identities = CertificateIdentities(context, options_);
  if (identities.empty() && options_.certificate_names_of) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "no client certificate stands behind this connection: connect with the certificate issued to '" +
                            Excerpt(caller->client) + "' (mutual TLS)");
  }
  if (!identities.empty() && std::find(identities.begin(), identities.end(), caller->client) == identities.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the client certificate (" + Excerpt(identities.front()) + ") is not issued to client '" +
                            Excerpt(caller->client) + "': use the certificate whose common name is the client id");
  }
  if (options_.authenticated_peer) options_.authenticated_peer(context->peer());
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* SplitTrainingService::Join(grpc::CallbackServerContext* context,
                                                     const amaq::v1::JoinRequest* request, amaq::v1::JoinReply* reply) {
  Caller caller;
  grpc::Status status = Authenticate(context, &caller);
  if (!status.ok()) return Done(context, status);
  const std::string& client = caller.client;
  if (tokens_.enabled() && request->client_id() != client) {
    return Done(context, grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                      "this token belongs to client '" + client + "', not '" + Excerpt(request->client_id()) +
                                          "': send the client id the token was issued for"));
  }
  if (!taking_steps()) return Done(context, StoppingStatus());
  try {
    const std::string owner = options_.owner_of ? options_.owner_of(request->client_id()) : "";
    if (!owner.empty()) {
      reply->set_owner_address(owner);  // nothing counted or kept here: the client is another replica's
      return Done(context, status);
    }
    const JoinInfo join = JoinInfoOf(*request);
    const int64_t last = server_.Join(join.client_id, join.fingerprint, join.cut_layer, join.method, join.run, join.start);
    reply->set_last_applied_step(last);
    reply->set_server_id(options_.server_id);
    reply->set_max_chunk_bytes(options_.max_chunk_bytes);
    reply->set_decode_cache(true);
    reply->set_micro_batches(server_.takes_micro_batches());
    reply->set_score_targets(true);
    CountTraffic(request->client_id(), request->ByteSizeLong(), reply->ByteSizeLong());
  } catch (const std::exception& e) {
    status = ToStatus(e);
  }
  return Done(context, status);
}

grpc::ServerBidiReactor<StepRequest, StepReply>* SplitTrainingService::Steps(grpc::CallbackServerContext* context) {
  Caller caller;
  const grpc::Status status = Authenticate(context, &caller);
  if (!status.ok() || caller.client.empty()) {
    struct Refuse : grpc::ServerBidiReactor<StepRequest, StepReply> {
      explicit Refuse(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refuse(status.ok() ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no client id: call Join first") : status);
  }
  return new StepsReactor(*this, caller.client, TokenOf(context));
}

grpc::ServerUnaryReactor* SplitTrainingService::SyncAdapters(grpc::CallbackServerContext* context,
                                                             const amaq::v1::AdapterUpload* request,
                                                             amaq::v1::AdapterAverage* reply) {
  Caller caller;
  const grpc::Status status = Authenticate(context, &caller);
  if (!status.ok()) return Done(context, status);
  int clients = 0;
  try {
    ToNamedTensors(server_.AverageAdapters(caller.client, FromNamedTensors(request->tensors()), &clients), reply->mutable_tensors());
  } catch (const std::exception& e) {
    return Done(context, ToStatus(e));
  }
  reply->set_clients(clients);
  return Done(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SplitTrainingService::Status(grpc::CallbackServerContext* context,
                                                       const amaq::v1::StatusRequest*, amaq::v1::StatusReply* reply) {
  Caller caller;
  const grpc::Status status = Authenticate(context, &caller);
  if (!status.ok()) return Done(context, status);
  reply->set_server_id(options_.server_id);
  reply->set_device(server_.device());
  const auto traffic_now = traffic();
  for (const auto& [id, stats] : server_.Stats()) {
    if (!caller.admin && id != caller.client) continue;  // tenants see only themselves
    auto* c = reply->add_clients();
    c->set_client_id(id);
    c->set_steps(stats.steps);
    c->set_last_loss(stats.last_loss);
    c->set_average_bits(stats.average_bits);
    const auto it = traffic_now.find(id);
    if (it != traffic_now.end()) {
      c->set_bytes_up(it->second.bytes_up);
      c->set_bytes_down(it->second.bytes_down);
      c->set_connected(it->second.connected);
    }
  }
  return Done(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<amaq::v1::ServerAdapter>* SplitTrainingService::FetchAdapter(grpc::CallbackServerContext* context,
                                                                                      const amaq::v1::AdapterRequest*) {
  Caller caller;
  grpc::Status status = Authenticate(context, &caller);
  if (status.ok() && caller.client.empty()) {
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no client id: call Join first");
  }
  std::vector<amaq::v1::ServerAdapter> parts;
  if (status.ok()) {
    try {
      parts = ServerAdapterParts(server_.AdapterOf(caller.client), static_cast<size_t>(options_.max_chunk_bytes));
      uint64_t bytes = 0;
      for (const amaq::v1::ServerAdapter& part : parts) bytes += part.ByteSizeLong();
      CountTraffic(caller.client, 0, bytes);
    } catch (const std::exception& e) {
      status = ToStatus(e);
    }
  }
  return new PartsWriter(std::move(parts), status);
}

grpc::ServerUnaryReactor* SplitTrainingService::ReportMetric(grpc::CallbackServerContext* context,
                                                             const amaq::v1::MetricReport* request, amaq::v1::MetricAck*) {
  Caller caller;
  const grpc::Status status = Authenticate(context, &caller);
  if (!status.ok()) return Done(context, status);
  try {
    server_.ReportMetric(caller.client, request->step(), request->name(), request->value());
  } catch (const std::exception& e) {
    return Done(context, ToStatus(e));
  }
  return Done(context, grpc::Status::OK);
}

std::map<std::string, Traffic> SplitTrainingService::traffic() const {
  std::lock_guard<std::mutex> lock(traffic_mutex_);
  return traffic_;
}

void SplitTrainingService::CountTraffic(const std::string& client, uint64_t up, uint64_t down) {
  std::lock_guard<std::mutex> lock(traffic_mutex_);
  traffic_[client].bytes_up += up;
  traffic_[client].bytes_down += down;
}

void SplitTrainingService::SetConnected(const std::string& client, bool connected) {
  std::lock_guard<std::mutex> lock(traffic_mutex_);
  traffic_[client].connected = connected;
}

}  // namespace amaq::server
