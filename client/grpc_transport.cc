#include "client/grpc_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "client/connection_faults.h"
#include "common/base/error.h"
#include "common/net/host_port.h"
#include "proto/grpc_status.h"
#include "proto/step_messages.h"

namespace amaq::client {

using amaq::v1::StepReply;
using amaq::v1::StepRequest;

namespace {

// Cancels a step's stream when the step takes longer than `seconds`: a stalled or blackholed link
// would otherwise block its read forever. The cancelled step is retried by the client.
class StepDeadline {
 public:
  StepDeadline(grpc::ClientContext* context, double seconds)
      : thread_([this, context, seconds] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_changed_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            expired_ = true;
            context->TryCancel();
          }
        }) {}
  ~StepDeadline() { Stop(); }
  // Ends the watch; after it returns the context is no longer touched.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool expired() {
    std::lock_guard<std::mutex> lock(mutex_);
    return expired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false, expired_ = false;
  std::thread thread_;
};

}  // namespace

// Writes a step stream's requests, in order, on its own thread. It stops when told to, or at the
// first failed write (the stream has ended: a Read learns why). Its destructor stops it, waiting
// for a write in progress, so a caller that must not wait cancels the stream's context first.
class StepWriter {
 public:
  explicit StepWriter(grpc::ClientReaderWriter<StepRequest, StepReply>* stream)
      : stream_(stream), thread_([this] { Run(); }) {}
  ~StepWriter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void Push(std::vector<StepRequest> requests) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (StepRequest& r : requests) queue_.push_back(std::move(r));
    }
    changed_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const StepRequest request = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      const bool written = stream_->Write(request);
      lock.lock();
      if (!written) return;
    }
  }

  grpc::ClientReaderWriter<StepRequest, StepReply>* stream_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<StepRequest> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is ready
};

GrpcTransport::GrpcTransport(GrpcOptions options) : options_(std::move(options)) {
  server_ = options_.server;
  Target(options_.server_name);
}

void GrpcTransport::Target(const std::string& tls_name) {
  const auto [host, port] = SplitHostPort(server_, "server");
  std::string target = server_;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (relay_) {  // the bytes of the link left behind still count
    metered_up_ += relay_->bytes_up();
    metered_down_ += relay_->bytes_down();
    relay_.reset();
  }
  if (options_.meter) {
    relay_ = std::make_unique<TcpRelay>(host, port);
    target = relay_->address();
  }
  host_ = host;
  port_ = port;
  tls_name_ = tls_name.empty() ? host : tls_name;
  if (!options_.insecure) args.SetSslTargetNameOverride(tls_name_);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  target_ = target;
  channel_args_ = args;
  Connect();
}

void GrpcTransport::Connect() {
  channel_ = grpc::CreateCustomChannel(target_, MakeChannelCredentials(options_.tls, options_.insecure), channel_args_);
  stub_ = amaq::v1::SplitTraining::NewStub(channel_);
}

GrpcTransport::~GrpcTransport() { CloseStream(); }

void GrpcTransport::Authorize(grpc::ClientContext* context) const {
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
  context->AddMetadata("x-amaq-client", client_id_);
}

void GrpcTransport::AuthorizeCall(grpc::ClientContext* context) const {
  Authorize(context);
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options_.call_timeout_seconds * 1000)));
}

void GrpcTransport::OpenStream() {
  if (stream_) return;
  stream_context_ = std::make_unique<grpc::ClientContext>();
  Authorize(stream_context_.get());
  stream_ = stub_->Steps(stream_context_.get());
  writer_ = std::make_unique<StepWriter>(stream_.get());
}

void GrpcTransport::CloseStream() {
  if (!stream_) return;
  stream_context_->TryCancel();
  EndStream();
}

grpc::Status GrpcTransport::EndStream() {
  writer_.reset();
  const grpc::Status status = stream_->Finish();
  stream_.reset();
  stream_context_.reset();
  in_flight_.clear();
  return status;
}

int64_t GrpcTransport::Join(const JoinInfo& info) {
  CloseStream();
  client_id_ = info.client_id;
  const amaq::v1::JoinRequest request = JoinRequestOf(info);
  amaq::v1::JoinReply reply;
  std::vector<std::string> visited{server_};
  for (;;) {
    grpc::ClientContext context;
    AuthorizeCall(&context);
    const grpc::Status status = stub_->Join(&context, request, &reply);
    if (!status.ok()) {
      // A channel that failed keeps backing off from a server that may be back already: the next
      // Join starts from a fresh one.
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) Connect();
      throw JoinError(status);
    }
    message_up_ += FramedBytes(request);
    message_down_ += FramedBytes(reply);
    if (reply.owner_address().empty()) break;
    FollowOwner(reply.owner_address(), &visited);
  }
  joined_ = true;
  refused_since_.reset();
  if (reply.max_chunk_bytes() > 0) max_chunk_bytes_ = reply.max_chunk_bytes();
  server_decode_cache_ = reply.decode_cache();
  server_micro_batches_ = reply.micro_batches();
  server_score_targets_ = reply.score_targets();
  return reply.last_applied_step();
}

void GrpcTransport::FollowOwner(const std::string& owner, std::vector<std::string>* visited) {
  std::string path;
  for (const auto& s : *visited) path += s + " -> ";
  Require(std::find(visited->begin(), visited->end(), owner) == visited->end() && visited->size() < kMaxRedirects,
          ErrorCode::kFailedPrecondition,
          "the replicas sent client " + client_id_ + " round in a loop (" + path + owner +
              "): give every replica of the set the same replicas and its own public_address, and restart them");
  SplitHostPort(owner, "the owner address a replica answered");
  spdlog::info("{} serves client {} (answered by {}): joining there", owner, client_id_, server_);
  visited->push_back(owner);
  server_ = owner;
  Target("");  // each replica's certificate names its own public_address host
}

grpc::Status GrpcTransport::NamedAsGiven(const grpc::Status& failed) const {
  // gRPC names the local byte meter it connects through; the user gave server_ (or a replica
  // sent the client there).
  std::string text = failed.error_message();
  if (relay_) {
    const std::string meter = "ipv4:" + relay_->address();
    for (size_t at = text.find(meter); at != std::string::npos; at = text.find(meter, at)) {
      text.replace(at, meter.size(), server_);
    }
  }
  return grpc::Status(failed.error_code(), text, failed.error_details());
}

Error GrpcTransport::ServerError(const grpc::Status& failed, const std::string& what) const {
  return ToError(NamedAsGiven(failed), what);
}

Error GrpcTransport::JoinError(const grpc::Status& failed) {
  const grpc::Status status = NamedAsGiven(failed);
  if (std::optional<Error> fault = PermanentTlsFault(status, server_, tls_name_)) return *fault;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !joined_ && !options_.insecure && options_.tls.cert.empty() &&
      RequestsClientCertificate(host_, port_, tls_name_, 3)) {
    return Error(ErrorCode::kFailedPrecondition,
                 "joining " + server_ + ": the server requires a client certificate (mutual TLS): set tls_cert and "
                 "tls_key to this client's (gRPC: " + Excerpt(status.error_message(), 160) + ")");
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !joined_ && RefusesConnections(host_, port_, 2)) {
    const auto now = std::chrono::steady_clock::now();
    if (!refused_since_) refused_since_ = now;
    const double refused = std::chrono::duration<double>(now - *refused_since_).count();
    const std::string message = "joining " + server_ + ": nothing listens there (connection refused" +
                                (refused >= 1 ? " for " + std::to_string(static_cast<int>(refused)) + " s" : "") +
                                "): start amaq-server there, or correct server";
    return Error(refused >= options_.refused_seconds ? ErrorCode::kFailedPrecondition : ErrorCode::kUnavailable, message);
  }
  return ToError(status, "joining " + server_);
}

StepResult GrpcTransport::Step(const StepInput& input) {
  Send(input);
  return Receive();
}

void GrpcTransport::Send(const StepInput& input) {
  OpenStream();
  std::vector<StepRequest> requests = StepRequests(input, static_cast<size_t>(max_chunk_bytes_));
  for (const StepRequest& request : requests) message_up_ += FramedBytes(request);
  writer_->Push(std::move(requests));
  in_flight_.push_back(input.step_id);
}

StepResult GrpcTransport::Receive() {
  Require(stream_ && !in_flight_.empty(), ErrorCode::kUnavailable,
          "no step is on its way (the stream broke after it was sent): send the step again");
  const int64_t step_id = in_flight_.front();
  StepDeadline deadline(stream_context_.get(), options_.call_timeout_seconds);
  // The stream has ended (or the deadline cancelled it): the writer stops at its next write, and
  // Finish gives the server's status. Every step in flight is lost.
  const auto fail = [&](const std::string& what) -> Error {
    deadline.Stop();
    const grpc::Status status = EndStream();
    if (deadline.expired()) {
      return Error(ErrorCode::kUnavailable, what + ": no answer within call_timeout_seconds (" +
                                                std::to_string(options_.call_timeout_seconds) + " s): the link stalled");
    }
    return status.ok() ? Error(ErrorCode::kUnavailable, what + ": the server closed the stream") : ServerError(status, what);
  };
  StepResult result;
  StepReply reply;
  for (int i = 0, total = 1; i < total; ++i) {
    if (!stream_->Read(&reply)) throw fail("receiving step " + std::to_string(step_id));
    message_down_ += FramedBytes(reply);
    if (i == 0) {
      total = std::max(1, reply.chunk_count());
      result.step_id = reply.step_id();
      result.loss = reply.loss();
      result.duplicate = reply.duplicate();
      result.average_bits = reply.average_bits();
      result.server_seconds = reply.server_seconds();
      result.scores.assign(reply.scores().begin(), reply.scores().end());
      result.next_tokens.assign(reply.next_tokens().begin(), reply.next_tokens().end());
    }
    Require(reply.chunk_index() == i && reply.step_id() == step_id, ErrorCode::kDataLoss,
            "the server answered step " + std::to_string(reply.step_id()) + " chunk " + std::to_string(reply.chunk_index()) +
                " where step " + std::to_string(step_id) + " chunk " + std::to_string(i) +
                " was due: the server and this client disagree; restart the client");
    result.gradient.insert(result.gradient.end(), reply.payload().begin(), reply.payload().end());
  }
  in_flight_.pop_front();
  return result;
}

template <typename Request, typename Reply, typename Rpc>
void GrpcTransport::Unary(const std::string& what, const Request& request, Reply* reply, Rpc rpc) {
  grpc::ClientContext context;
  AuthorizeCall(&context);
  const grpc::Status status = rpc(&context);
  if (!status.ok()) throw ServerError(status, what);
  message_up_ += FramedBytes(request);
  message_down_ += FramedBytes(*reply);
}

NamedFloats GrpcTransport::SyncAdapters(const NamedFloats& adapter) {
  amaq::v1::AdapterUpload request;
  ToNamedTensors(adapter, request.mutable_tensors());
  amaq::v1::AdapterAverage reply;
  Unary("averaging adapters", request, &reply, [&](grpc::ClientContext* c) { return stub_->SyncAdapters(c, request, &reply); });
  return FromNamedTensors(reply.tensors());
}

ServerAdapterInfo GrpcTransport::FetchAdapter() {
  const amaq::v1::AdapterRequest request;
  grpc::ClientContext context;
  AuthorizeCall(&context);
  const std::unique_ptr<grpc::ClientReader<amaq::v1::ServerAdapter>> reader = stub_->FetchAdapter(&context, request);
  ServerAdapterInfo info;
  size_t parts = 0;
  for (amaq::v1::ServerAdapter part; reader->Read(&part); ++parts) {
    message_down_ += FramedBytes(part);
    try {
      AddServerAdapterPart(part, parts, &info);
    } catch (const Error&) {
      context.TryCancel();
      reader->Finish();
      throw;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) throw ServerError(status, "fetching the server's adapter");
  Require(parts > 0, ErrorCode::kDataLoss, "the server's adapter came without a part: the server is faulty; report it");
  message_up_ += FramedBytes(request);
  return info;
}

void GrpcTransport::ReportMetric(int64_t step, const std::string& name, double value) {
  const amaq::v1::MetricReport request = MetricReportMessage(step, name, value);
  amaq::v1::MetricAck reply;
  Unary("reporting the metric", request, &reply, [&](grpc::ClientContext* c) { return stub_->ReportMetric(c, request, &reply); });
}

uint64_t GrpcTransport::bytes_up() const { return relay_ ? metered_up_ + relay_->bytes_up() : message_up_; }
uint64_t GrpcTransport::bytes_down() const { return relay_ ? metered_down_ + relay_->bytes_down() : message_down_; }

}  // namespace amaq::client
