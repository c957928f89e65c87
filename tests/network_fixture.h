// The fixture of the tests over real gRPC with TLS on loopback: a tiny model, certificates from
// scripts/make-certs, a tokens file for client-1 and client-2, a server started on demand, and a
// raw stub for tests that speak the protocol by hand (abuse tests).
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

#include "amaq/v1/split_training.grpc.pb.h"
#include "client/grpc_transport.h"
#include "client/split_client.h"
#include "common/checkpoint.h"
#include "common/tls.h"
#include "server/grpc_service.h"
#include "tiny_model.h"

namespace amaq::testing {

inline const char kToken1[] = "token-of-client-one-0123456789";
inline const char kToken2[] = "token-of-client-two-0123456789";

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
    const std::string command = std::string(AMAQ_SOURCE_DIR) + "/scripts/make-certs " + *certs_ + " client-1";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    tokens_ = new std::string(*certs_ + "/tokens");
    std::ofstream(*tokens_) << "client-1 " << kToken1 << "\nclient-2 " << kToken2 << "\n";
  }

  void StartServer(const std::string& checkpoint_dir = "", int port = 0) {
    server::ServerOptions o = testing::TinyServerOptions(*model_);
    o.checkpoint_dir = checkpoint_dir;
    o.checkpoint_every = 1;
    o.max_batch_tokens = max_batch_tokens_;
    split_ = std::make_unique<server::SplitServer>(o);
    tokens_store_ = std::make_unique<server::TokenStore>(use_tokens_ ? *tokens_ : "");
    server::ServiceOptions s;
    s.max_chunk_bytes = 4096;  // small: every step is chunked
    s.stall_timeout_seconds = stall_timeout_seconds_;
    service_ = std::make_unique<server::SplitTrainingService>(*split_, *tokens_store_, s);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port),
                             MakeServerCredentials(TlsFiles{*certs_ + "/server.pem", *certs_ + "/server.key", ""}, false), &port_);
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

  // A raw client of the protocol, for tests that send what a well-behaved client never would.
  std::unique_ptr<amaq::v1::SplitTraining::Stub> RawStub() const {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return amaq::v1::SplitTraining::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port_), MakeChannelCredentials(TlsFiles{"", "", *certs_ + "/ca.pem"}, false), args));
  }
  grpc::Status RawJoin(amaq::v1::SplitTraining::Stub& stub, const std::string& token, const std::string& client_id,
                       const std::string& method) const {
    grpc::ClientContext context;
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
  int64_t max_batch_tokens_ = 65536;
  static std::string* model_;
  static std::string* certs_;
  static std::string* tokens_;
  std::unique_ptr<server::SplitServer> split_;
  std::unique_ptr<server::TokenStore> tokens_store_;
  std::unique_ptr<server::SplitTrainingService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  int port_ = 0;
};

inline std::string* Network::model_ = nullptr;
inline std::string* Network::certs_ = nullptr;
inline std::string* Network::tokens_ = nullptr;

}  // namespace amaq::testing
