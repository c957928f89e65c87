#include "server/grpc_service.h"

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "proto/step_messages.h"

namespace amaq::server {
namespace {

using amaq::v1::StepReply;
using amaq::v1::StepRequest;

grpc::StatusCode CodeOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorCode::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case ErrorCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case ErrorCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorCode::kUnauthenticated: return grpc::StatusCode::UNAUTHENTICATED;
    case ErrorCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case ErrorCode::kInternal: return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::UNKNOWN;
}

// One client's step stream: reassembles request chunks, computes on the service's worker, and
// writes the reply in chunks, one step after another. gRPC calls its methods from its own threads
// and the watchdog may end it from another: every operation on the stream takes mutex_.
class StepsReactor : public grpc::ServerBidiReactor<StepRequest, StepReply>, public WatchedStream {
 public:
  StepsReactor(SplitTrainingService& service, std::string client, std::string token)
      : service_(service), client_(std::move(client)), token_(std::move(token)), assembler_(service.limits()) {
    service_.SetConnected(client_, true);
    service_.Watch(this);
    Read();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK);  // the client closed its side
    service_.CountTraffic(client_, request_.ByteSizeLong(), 0);
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
    if (!service_.StillAuthorized(token_, client_)) {  // revoked while the stream was open
      return End(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                              "the token of client '" + client_ + "' was revoked: ask the server's operator for a new one"));
    }
    Progress(Phase::kComputing);
    input_ = assembler_.Take();
    service_.Post([this] { Compute(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    Progress(Phase::kReplying);
    WriteNext();
  }

  void OnDone() override {
    service_.Unwatch(this);
    service_.SetConnected(client_, false);
    delete this;
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

 private:
  enum class Phase { kIdle, kReceiving, kComputing, kReplying };

  void Progress(Phase phase) {
    last_progress_ = std::chrono::steady_clock::now();
    phase_ = phase;
  }

  void Compute() {
    StepResult result;
    try {
      result = service_.server().Step(client_, input_);
    } catch (const std::exception& e) {
      spdlog::warn("client {}: step {} refused: {}", client_, input_.step_id, e.what());
      return End(ToStatus(e));
    }
    replies_ = StepReplies(result, static_cast<size_t>(service_.options().max_chunk_bytes));
    for (const StepReply& reply : replies_) service_.CountTraffic(client_, 0, reply.ByteSizeLong());
    input_.activation = {};
    next_reply_ = 0;
    Progress(Phase::kReplying);
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
  StepInput input_;
  std::vector<StepReply> replies_;
  size_t next_reply_ = 0;
  std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<int64_t> step_id_{0};
  std::atomic<std::chrono::steady_clock::time_point> last_progress_{std::chrono::steady_clock::now()};
  std::mutex mutex_;
  bool finished_ = false;
};

// A unary reactor that finishes at once with `status`.
grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::Status ToStatus(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return grpc::Status(CodeOf(error->code()), error->what());
  return grpc::Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
}

SplitTrainingService::SplitTrainingService(SplitServer& server, TokenStore& tokens, ServiceOptions options)
    : server_(server), tokens_(tokens), options_(std::move(options)) {
  limits_.max_chunk_bytes = options_.max_chunk_bytes;
  limits_.max_chunks = options_.max_chunks;
  limits_.max_batch_tokens = server_.max_batch_tokens();
  limits_.vocab_size = server_.config().vocab_size;
  // fp32 of the largest batch, plus room for the codec's scales and bits tables.
  limits_.max_step_bytes = static_cast<uint64_t>(limits_.max_batch_tokens) * server_.config().hidden_size * 4 + (1 << 20);
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
    }
  });
  worker_ = std::thread([this] {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
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
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_ready_.notify_all();
  worker_.join();
}

void SplitTrainingService::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(fn));
  }
  queue_ready_.notify_one();
}

void SplitTrainingService::Watch(WatchedStream* stream) {
  std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
  streams_.insert(stream);
}

void SplitTrainingService::Unwatch(WatchedStream* stream) {
  std::lock_guard<std::recursive_mutex> lock(watch_mutex_);
  streams_.erase(stream);
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

bool SplitTrainingService::StillAuthorized(const std::string& token, const std::string& client) {
  return !tokens_.enabled() || tokens_.ClientOf(token) == client;
}

grpc::Status SplitTrainingService::Authenticate(const grpc::CallbackServerContext* context, std::string* client) {
  const auto& metadata = context->client_metadata();
  const std::string token = TokenOf(context);
  if (!tokens_.enabled()) {
    const auto claimed = metadata.find("x-amaq-client");
    *client = claimed == metadata.end() ? "" : std::string(claimed->second.data(), claimed->second.size());
    return grpc::Status::OK;
  }
  const std::optional<std::string> owner = tokens_.ClientOf(token);
  if (!owner) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        token.empty() ? "no bearer token: set the client's token (authorization: Bearer <token>)"
                                      : "unknown or revoked token: ask the server's operator for a valid one");
  }
  *client = *owner;
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* SplitTrainingService::Join(grpc::CallbackServerContext* context,
                                                     const amaq::v1::JoinRequest* request, amaq::v1::JoinReply* reply) {
  std::string client;
  grpc::Status status = Authenticate(context, &client);
  if (!status.ok()) return Done(context, status);
  if (tokens_.enabled() && request->client_id() != client) {
    return Done(context, grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                      "this token belongs to client '" + client + "', not '" + request->client_id() + "'"));
  }
  try {
    const int64_t last = server_.Join(request->client_id(), request->model_fingerprint(), request->cut_layer(), request->method());
    reply->set_last_applied_step(last);
    reply->set_server_id(options_.server_id);
    reply->set_max_chunk_bytes(options_.max_chunk_bytes);
    CountTraffic(request->client_id(), request->ByteSizeLong(), reply->ByteSizeLong());
  } catch (const std::exception& e) {
    status = ToStatus(e);
  }
  return Done(context, status);
}

grpc::ServerBidiReactor<StepRequest, StepReply>* SplitTrainingService::Steps(grpc::CallbackServerContext* context) {
  std::string client;
  const grpc::Status status = Authenticate(context, &client);
  if (!status.ok() || client.empty()) {
    struct Refuse : grpc::ServerBidiReactor<StepRequest, StepReply> {
      explicit Refuse(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refuse(status.ok() ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no client id: call Join first") : status);
  }
  return new StepsReactor(*this, client, TokenOf(context));
}

grpc::ServerUnaryReactor* SplitTrainingService::SyncAdapters(grpc::CallbackServerContext* context,
                                                             const amaq::v1::AdapterUpload* request,
                                                             amaq::v1::AdapterAverage* reply) {
  std::string client;
  const grpc::Status status = Authenticate(context, &client);
  if (!status.ok()) return Done(context, status);
  int clients = 0;
  try {
    ToNamedTensors(server_.AverageAdapters(client, FromNamedTensors(request->tensors()), &clients), reply->mutable_tensors());
  } catch (const std::exception& e) {
    return Done(context, ToStatus(e));
  }
  reply->set_clients(clients);
  return Done(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SplitTrainingService::Status(grpc::CallbackServerContext* context,
                                                       const amaq::v1::StatusRequest*, amaq::v1::StatusReply* reply) {
  std::string client;
  const grpc::Status status = Authenticate(context, &client);
  if (!status.ok()) return Done(context, status);
  reply->set_server_id(options_.server_id);
  reply->set_device(server_.device());
  const auto traffic_now = traffic();
  for (const auto& [id, stats] : server_.Stats()) {
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
