#include "server/grpc_service.h"

#include <spdlog/spdlog.h>

#include "common/error.h"

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
// writes the reply in chunks, one step after another.
class StepsReactor : public grpc::ServerBidiReactor<StepRequest, StepReply> {
 public:
  StepsReactor(SplitTrainingService& service, std::string client) : service_(service), client_(std::move(client)) {
    service_.SetConnected(client_, true);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK);  // the client closed its side
    try {
      Accumulate();
    } catch (const std::exception& e) {
      return End(ToStatus(e));
    }
    if (request_.chunk_index() + 1 < request_.chunk_count()) {
      StartRead(&request_);
      return;
    }
    service_.Post([this] { Compute(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    WriteNext();
  }

  void OnDone() override {
    service_.SetConnected(client_, false);
    delete this;
  }

 private:
  void Accumulate() {
    const int limit = service_.options().max_chunk_bytes;
    service_.CountTraffic(client_, request_.ByteSizeLong(), 0);
    Require(request_.chunk_count() >= 1 && request_.chunk_count() <= service_.options().max_chunks &&
                request_.chunk_index() == expected_chunk_ && static_cast<int>(request_.payload().size()) <= limit,
            ErrorCode::kInvalidArgument,
            "step chunk " + std::to_string(request_.chunk_index()) + "/" + std::to_string(request_.chunk_count()) +
                " is out of order, too many or larger than max_chunk_bytes (" + std::to_string(limit) + ")");
    if (expected_chunk_ == 0) {
      input_ = StepInput{};
      input_.step_id = request_.step_id();
      Require(request_.kind() >= StepRequest::TRAIN && request_.kind() <= StepRequest::NEXT_TOKEN,
              ErrorCode::kInvalidArgument, "unknown step kind");
      input_.kind = static_cast<StepKind>(request_.kind());
      input_.sample_ids.assign(request_.sample_ids().begin(), request_.sample_ids().end());
      input_.batch = request_.batch();
      input_.tokens = request_.tokens();
      input_.mask.assign(request_.attention_mask().begin(), request_.attention_mask().end());
      input_.labels.assign(request_.labels().begin(), request_.labels().end());
      chunk_count_ = request_.chunk_count();
    } else {
      Require(request_.chunk_count() == chunk_count_ && request_.step_id() == input_.step_id, ErrorCode::kInvalidArgument,
              "a step's chunks must agree on step_id and chunk_count");
    }
    input_.activation.insert(input_.activation.end(), request_.payload().begin(), request_.payload().end());
    expected_chunk_ = request_.chunk_index() + 1 < request_.chunk_count() ? expected_chunk_ + 1 : 0;
  }

  void Compute() {
    StepResult result;
    try {
      result = service_.server().Step(client_, input_);
    } catch (const std::exception& e) {
      spdlog::warn("client {}: step {} refused: {}", client_, input_.step_id, e.what());
      return End(ToStatus(e));
    }
    replies_.clear();
    const size_t chunk = static_cast<size_t>(service_.options().max_chunk_bytes);
    const size_t count = std::max<size_t>(1, (result.gradient.size() + chunk - 1) / chunk);
    for (size_t i = 0; i < count; ++i) {
      StepReply reply;
      reply.set_step_id(result.step_id);
      reply.set_chunk_index(static_cast<int>(i));
      reply.set_chunk_count(static_cast<int>(count));
      if (i == 0) {
        reply.set_loss(result.loss);
        reply.set_duplicate(result.duplicate);
        reply.set_average_bits(result.average_bits);
        reply.set_server_seconds(result.server_seconds);
        *reply.mutable_scores() = {result.scores.begin(), result.scores.end()};
        *reply.mutable_next_tokens() = {result.next_tokens.begin(), result.next_tokens.end()};
      }
      const size_t begin = i * chunk, end = std::min(result.gradient.size(), begin + chunk);
      if (begin < end) reply.set_payload(result.gradient.data() + begin, end - begin);
      service_.CountTraffic(client_, 0, reply.ByteSizeLong());
      replies_.push_back(std::move(reply));
    }
    input_.activation.clear();
    next_reply_ = 0;
    WriteNext();
  }

  void WriteNext() {
    if (next_reply_ < replies_.size()) {
      StartWrite(&replies_[next_reply_++]);
    } else {
      StartRead(&request_);
    }
  }

  void End(const grpc::Status& status) {
    if (!finished_.exchange(true)) Finish(status);
  }

  SplitTrainingService& service_;
  std::string client_;
  StepRequest request_;
  StepInput input_;
  int expected_chunk_ = 0, chunk_count_ = 0;
  std::vector<StepReply> replies_;
  size_t next_reply_ = 0;
  std::atomic<bool> finished_{false};
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

grpc::Status SplitTrainingService::Authenticate(const grpc::CallbackServerContext* context, std::string* client) {
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  const std::string header = it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
  const std::string token = header.rfind("Bearer ", 0) == 0 ? header.substr(7) : "";
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
  return new StepsReactor(*this, client);
}

grpc::ServerUnaryReactor* SplitTrainingService::SyncAdapters(grpc::CallbackServerContext* context,
                                                             const amaq::v1::AdapterUpload* request,
                                                             amaq::v1::AdapterAverage* reply) {
  std::string client;
  const grpc::Status status = Authenticate(context, &client);
  if (!status.ok()) return Done(context, status);
  NamedFloats upload;
  for (const auto& t : request->tensors()) {
    upload[t.name()] = NamedFloat{{t.shape().begin(), t.shape().end()}, {t.values().begin(), t.values().end()}};
  }
  int clients = 0;
  try {
    for (const auto& [name, mean] : server_.AverageAdapters(client, upload, &clients)) {
      auto* out = reply->add_tensors();
      out->set_name(name);
      *out->mutable_shape() = {mean.shape.begin(), mean.shape.end()};
      *out->mutable_values() = {mean.values.begin(), mean.values.end()};
    }
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
