// The fixture of the tests over real gRPC with TLS on loopback: a tiny model, certificates from
// scripts/make-certs (the server's, and client certificates for client-1 and client-2), a tokens
// file for client-1, client-2 and an operator (admin), a server started on demand (with mutual TLS
// when asked), and a raw stub for tests that speak the protocol by hand (abuse tests).
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "amaq/v1/split_training.grpc.pb.h"
#include "client/grpc_transport.h"
#include "inproc/local_transport.h"
#include "client/split_client.h"
#include "common/model/checkpoint.h"
#include "common/net/tls.h"
#include "process.h"
#include "server/grpc_service.h"
#include "server/split_server.h"
#include "tiny_model.h"

namespace amaq::testing {

inline const char kToken1[] = "token-of-client-one-0123456789";
inline const char kToken2[] = "token-of-client-two-0123456789";
inline const char kAdminToken[] = "token-of-the-operator-0123456789";

// Everything a test needs: a tiny model, certificates, tokens, and a running server.
class Network : public ::testing::Test {
 public:
  static void Authorize(grpc::ClientContext* context, const std::string& token) {
    context->AddMetadata("authorization", "Bearer " + token);
  }

 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(testing::TinyModelDir("network"));
    certs_ = new std::string(testing::TempDir("certs"));
    const std::string command = std::string(AMAQ_SOURCE_DIR) + "/scripts/make-certs " + *certs_ + " client-1 client-2";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    tokens_ = new std::string(*certs_ + "/tokens");
    std::ofstream(*tokens_) << "client-1 " << kToken1 << "\nclient-2 " << kToken2 << "\noperator " << kAdminToken << " admin\n";
  }
  // The model and certificates are scaffolding, not evidence (a test's own folders, with its
  // server's log, stay for inspection): they go, so that each test process leaves no copy behind.
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*model_);
    std::filesystem::remove_all(*certs_);
  }

  void StartServer(const std::string& checkpoint_dir = "", int port = 0) {
    server::ServerOptions o = testing::TinyServerOptions(*model_);
    o.checkpoint_dir = checkpoint_dir;
    o.checkpoint_every = 1;
    o.max_batch_tokens = max_batch_tokens_;
    o.session_ttl_seconds = session_ttl_seconds_;
    o.max_step_memory_mb = max_step_memory_mb_;
    o.max_client_memory_mb = max_client_memory_mb_;
    o.shared_lora = shared_lora_;
    if (server_lora_rank_ > 0) o.lora.rank = server_lora_rank_;
    split_ = std::make_unique<server::SplitServer>(o);
    tokens_store_ = std::make_unique<server::TokenStore>(use_tokens_ ? *tokens_ : "");
    server::ServiceOptions s;
    s.max_chunk_bytes = 4096;  // small: every step is chunked
    s.stall_timeout_seconds = stall_timeout_seconds_;
    s.batching.max_tokens = 1 << 16;  // the steps of clients that meet in the queue run as one batch
    service_ = std::make_unique<server::SplitTrainingService>(*split_, *tokens_store_, s);
    server::EnableStandardServices();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port),
                             MakeServerCredentials(TlsFiles{*certs_ + "/server.pem", *certs_ + "/server.key",
                                                            mutual_tls_ ? *certs_ + "/ca.pem" : ""},
                                                   false),
                             &port_);
    server::HardenServerBuilder(builder, *service_);
    builder.RegisterService(service_.get());
    grpc_ = builder.BuildAndStart();
    ASSERT_TRUE(grpc_);
  }

  void StopServer() {
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc_.reset();
    service_.reset();
    split_.reset();
  }

  void TearDown() override {
    if (grpc_) StopServer();
  }

  client::GrpcOptions ClientTransport(const std::string& token, int port) {
    client::GrpcOptions g;
    g.server = "127.0.0.1:" + std::to_string(port);
    g.server_name = "localhost";
    g.tls.ca = *certs_ + "/ca.pem";
    g.token = token;
    g.call_timeout_seconds = 10;
    return g;
  }

  client::ClientOptions ClientFor(const std::string& id, const std::string& method, int64_t steps) {
    return testing::TinyClientOptions(*model_, id, method, steps);
  }

  // The losses of `options`' first `steps` training steps without a network (a fresh server in
  // this process): what a run over a faulty link must reproduce when no step is lost and none is
  // applied twice, on either side.
  std::vector<float> LossesWithoutNetwork(const client::ClientOptions& options, const Dataset& data) const {
    server::SplitServer server(testing::TinyServerOptions(*model_));
    inproc::LocalTransport transport(server);
    client::SplitClient c(options, data, transport);
    std::vector<float> losses;
    for (int64_t step = c.Join(); step < options.steps; ++step) losses.push_back(c.TrainStep(step).loss);
    return losses;
  }
  static std::vector<float> Losses(const client::SplitClient& c) {
    std::vector<float> losses;
    for (const auto& r : c.records()) losses.push_back(r.loss);
    return losses;
  }

  // An amaq-server process (TLS with this fixture's certificates, its tokens, one thread) on a free
  // port, with `extra` arguments; once it has written its port, port_ is that port (a failure is
  // recorded if it never does). Its log is `dir`/server.log; it is killed when the result goes.
  std::unique_ptr<testing::Process> StartServerProcess(const std::string& dir, const std::vector<std::string>& extra = {}) {
    const std::string port_file = dir + "/port";
    std::vector<std::string> args = {AMAQ_BIN_DIR "/amaq-server", "--model", *model_, "--listen", "127.0.0.1:0",
                                     "--port_file", port_file, "--tls_cert", *certs_ + "/server.pem", "--tls_key",
                                     *certs_ + "/server.key", "--tokens_file", *tokens_, "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = std::make_unique<testing::Process>(args, dir + "/server.log");
    port_ = testing::WaitForPortFile(port_file, 60);
    EXPECT_GT(port_, 0) << "the server wrote no port:\n" << server->Log();
    return server;
  }

  // A raw client of the protocol, for tests that send what a well-behaved client never would.
  // With `certificate` ("client-1", ...) it presents that client certificate (mutual TLS).
  std::shared_ptr<grpc::Channel> RawChannel(const std::string& certificate = "") const {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    const TlsFiles files = certificate.empty() ? TlsFiles{"", "", *certs_ + "/ca.pem"}
                                               : TlsFiles{*certs_ + "/" + certificate + ".pem",
                                                          *certs_ + "/" + certificate + ".key", *certs_ + "/ca.pem"};
    return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), MakeChannelCredentials(files, false), args);
  }
  std::unique_ptr<amaq::v1::SplitTraining::Stub> RawStub(const std::string& certificate = "") const {
    return amaq::v1::SplitTraining::NewStub(RawChannel(certificate));
  }
  // With `deadline_seconds` > 0, a Join not answered within it fails with DEADLINE_EXCEEDED.
  grpc::Status RawJoin(amaq::v1::SplitTraining::Stub& stub, const std::string& token, const std::string& client_id,
                       const std::string& method, double deadline_seconds = 0) const {
    grpc::ClientContext context;
    if (deadline_seconds > 0) {
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(deadline_seconds)));
    }
    Authorize(&context, token);
    amaq::v1::JoinRequest join;
    join.set_client_id(client_id);
    join.set_model_fingerprint(ModelFingerprint(*model_, 2));
    join.set_cut_layer(2);
    join.set_method(method);
    amaq::v1::JoinReply joined;
    return stub.Join(&context, join, &joined);
  }

  double stall_timeout_seconds_ = 30;
  bool use_tokens_ = true;  // false: every client is accepted as the id it claims
  bool mutual_tls_ = false; // true: clients must present a certificate of the test CA
  int64_t max_batch_tokens_ = 65536;
  double session_ttl_seconds_ = 0;  // set with a checkpoint_dir: idle sessions are evicted
  int64_t max_step_memory_mb_ = 0, max_client_memory_mb_ = 0;  // 0: the device's share
  bool shared_lora_ = false;
  int64_t server_lora_rank_ = 0;  // 0: the tiny model's default
  static std::string* model_;
  static std::string* certs_;
  static std::string* tokens_;
  std::unique_ptr<server::SplitServer> split_;
  std::unique_ptr<server::TokenStore> tokens_store_;
  std::unique_ptr<server::SplitTrainingService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  int port_ = 0;
};

// The first chunk of a step of batch 1 x 2 tokens (fields valid), whose payload is `payload`.
inline amaq::v1::StepRequest FirstChunk(const std::string& payload, int chunk_count) {
  amaq::v1::StepRequest r;
  r.set_batch(1);
  r.set_tokens(2);
  r.add_attention_mask(1);
  r.add_attention_mask(1);
  r.add_labels(-100);
  r.add_labels(3);
  r.set_chunk_count(chunk_count);
  r.set_payload(payload);
  return r;
}

// The chunks of `first` (its fields) carrying `payload` in pieces of at most `chunk_bytes`.
inline std::vector<amaq::v1::StepRequest> Chunked(amaq::v1::StepRequest first, const std::string& payload,
                                                  size_t chunk_bytes) {
  const int count = static_cast<int>(std::max<size_t>(1, (payload.size() + chunk_bytes - 1) / chunk_bytes));
  std::vector<amaq::v1::StepRequest> chunks;
  for (int i = 0; i < count; ++i) {
    amaq::v1::StepRequest r = i == 0 ? first : amaq::v1::StepRequest();
    r.set_step_id(first.step_id());
    r.set_kind(first.kind());
    r.set_chunk_index(i);
    r.set_chunk_count(count);
    r.set_payload(payload.substr(static_cast<size_t>(i) * chunk_bytes, chunk_bytes));
    chunks.push_back(std::move(r));
  }
  return chunks;
}

// Sends `requests` on a fresh step stream as the owner of `token` and returns how the server ended it.
inline grpc::Status SendSteps(amaq::v1::SplitTraining::Stub& stub, const std::vector<amaq::v1::StepRequest>& requests,
                              const std::string& token = kToken2) {
  grpc::ClientContext context;
  Network::Authorize(&context, token);
  auto stream = stub.Steps(&context);
  for (const auto& r : requests) {
    if (!stream->Write(r)) break;
  }
  stream->WritesDone();
  amaq::v1::StepReply reply;
  while (stream->Read(&reply)) {
  }
  return stream->Finish();
}

inline std::string* Network::model_ = nullptr;
inline std::string* Network::certs_ = nullptr;
inline std::string* Network::tokens_ = nullptr;

}  // namespace amaq::testing
