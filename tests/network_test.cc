// The split-training system over real gRPC with TLS on loopback: clients and a server in one test
// process, talking through sockets.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <future>
#include <thread>

#include "client/client_config.h"
#include "client/grpc_transport.h"
#include "inproc/local_transport.h"
#include "client/split_client.h"
#include "common/model/checkpoint.h"
#include "common/base/error.h"
#include "common/model/finetune.h"
#include "common/net/netem_config.h"
#include "common/net/tcp_relay.h"
#include "server/grpc_service.h"
#include "server/prometheus_text.h"
#include "server/server_config.h"
#include "network_fixture.h"
#include "process.h"
#include "tiny_model.h"

namespace amaq {
namespace {

using testing::kToken1;
using testing::kToken2;
using testing::Network;


double MeanLoss(const std::vector<client::StepRecord>& r, size_t begin, size_t n) {
  double s = 0;
  for (size_t i = begin; i < begin + n; ++i) s += r[i].loss;
  return s / static_cast<double>(n);
}

// The value of an unlabelled metric in Prometheus text (NaN when absent).
double MetricValue(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? std::nan("") : std::stod(text.substr(at + name.size() + 2));
}

TEST_F(Network, TwoClientsOverTlsTrainAndCountTheSocketsBytes) {
  StartServer();
  // The "wire": everything between the clients and the server crosses this relay.
  TcpRelay wire("127.0.0.1", static_cast<uint16_t>(port_));
  std::vector<std::vector<client::StepRecord>> records(2);
  // The transports outlive the clients' threads, so that both sides are counted while every
  // connection is still open and idle (closing them sends a last few bytes through the wire).
  std::vector<std::unique_ptr<client::GrpcTransport>> transports;
  for (int i = 0; i < 2; ++i) {
    transports.push_back(std::make_unique<client::GrpcTransport>(ClientTransport(i == 0 ? kToken1 : kToken2, wire.port())));
  }
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      client::SplitClient c(ClientFor(i == 0 ? "client-1" : "client-2", i == 0 ? "amaq:8->3" : "fixed:4:channel", 20),
                            testing::ParityDataset(48), *transports[static_cast<size_t>(i)]);
      c.Run();
      records[static_cast<size_t>(i)] = c.records();
    });
  }
  for (auto& t : clients) t.join();
  // Both relays count a byte once it is written on; give bytes still in flight (HTTP/2 control
  // frames written as training ends) up to 5 s to arrive, then compare.
  uint64_t counted_up = 0, counted_down = 0;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    counted_up = counted_down = 0;
    for (const auto& t : transports) {
      counted_up += t->bytes_up();
      counted_down += t->bytes_down();
    }
    if (counted_up == wire.bytes_up() && counted_down == wire.bytes_down()) break;
  }
  for (const auto& r : records) {
    ASSERT_GE(r.size(), 20u);
    EXPECT_LT(MeanLoss(r, 15, 5), MeanLoss(r, 0, 5)) << "the loss must fall";
  }
  EXPECT_GT(counted_up, 0u);
  EXPECT_EQ(counted_up, wire.bytes_up()) << "client byte counts must equal what crossed the socket";
  EXPECT_EQ(counted_down, wire.bytes_down());
  const auto stats = split_->Stats();
  EXPECT_EQ(stats.at("client-1").steps, 20);
  EXPECT_EQ(stats.at("client-2").steps, 20);
  // /metrics counts the compute stage's batches (steps of both clients meet in some of them).
  const std::string metrics = server::PrometheusText(*service_);
  const double batches = MetricValue(metrics, "amaq_batches_total"), steps = MetricValue(metrics, "amaq_batched_steps_total");
  EXPECT_GE(steps, 40) << "every training step (and the evaluations) went through a batch";
  EXPECT_GE(batches, steps / 2) << "at most one step of each of the two clients per batch";
  EXPECT_LE(batches, steps);
  EXPECT_EQ(MetricValue(metrics, "amaq_sessions_in_memory"), 2);
}

TEST_F(Network, Fp32OverTheNetworkFollowsLocalTraining) {
  StartServer();
  const FinetuneResult reference = FinetuneLocal(testing::ParityDataset(48), testing::TinyLocalOptions(*model_, 15));
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::ClientOptions o = ClientFor("client-1", "fp32", 15);
  o.micro_batches = 1;  // the local run's whole steps, rounding included
  client::SplitClient c(o, testing::ParityDataset(48), transport);
  c.Run();
  for (size_t i = 0; i < 15; ++i) {
    EXPECT_NEAR(c.records()[i].loss, reference.losses[i], 1e-4 * std::fabs(reference.losses[i]) + 1e-5) << "step " << i;
  }
}

// Drain (issue 55 item 4): once the server stops taking steps (SIGTERM, SIGINT), a client's next
// step is refused UNAVAILABLE at once and not applied (before, steps went on being applied for
// the 10 s of gRPC's shutdown), and so is a Join; the client gives up after retry_seconds.
TEST_F(Network, ADrainingServerAppliesNoNewStep) {
  StartServer();
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::ClientOptions o = ClientFor("client-1", "bf16", 10);
  o.retry_seconds = 1;
  client::SplitClient c(o, testing::ParityDataset(48), transport);
  int64_t step = c.Join();
  for (; step < 2; ++step) c.TrainStep(step);
  service_->StopTakingSteps();
  try {
    c.TrainStep(step);
    ADD_FAILURE() << "a draining server must refuse new steps";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("the server is stopping"), std::string::npos) << e.what();
  }
  EXPECT_EQ(split_->Stats().at("client-1").steps, 2) << "no step after the drain began was applied";
  const grpc::Status join = RawJoin(*RawStub(), kToken2, "client-2", "bf16");
  EXPECT_EQ(join.error_code(), grpc::StatusCode::UNAVAILABLE) << join.error_message();
}

// The JoinReply says whether the server takes a step in parts: a server training one shared LoRA
// refuses parts, so a client set to send them sends its steps whole there, and trains.
TEST_F(Network, ClientsSendWholeStepsToAServerWithOneSharedLora) {
  for (const bool shared : {false, true}) {
    shared_lora_ = shared;
    StartServer();
    client::GrpcTransport transport(ClientTransport(testing::kToken1, port_));
    client::ClientOptions o = ClientFor("client-1", "fixed:4:channel", 3);
    o.micro_batches = 4;
    client::SplitClient c(o, testing::ParityDataset(48), transport);
    EXPECT_NO_THROW(c.Run()) << (shared ? "shared LoRA" : "per-client LoRA");
    EXPECT_EQ(transport.server_takes_micro_batches(), !shared);
    EXPECT_EQ(split_->Stats().at("client-1").steps, 3);
    StopServer();
  }
}

// amaq-study runs in one process and counts the gRPC messages the network path would exchange:
// the same run over gRPC counts exactly as many message bytes, and the socket carries those plus
// the transport's own overhead (TLS records and handshake, HTTP/2 frames and headers).
// A transport that shows every step and its reply to `on_step`.
template <typename Base>
struct RecordingSteps : Base {
  using Base::Base;
  StepResult Step(const StepInput& input) override {
    StepResult r = Base::Step(input);
    on_step(input, r);
    return r;
  }
  std::function<void(const StepInput&, const StepResult&)> on_step;
};

// Exact-match evaluation over gRPC decodes with the server's cache (the cache field crosses the
// wire, the JoinReply announces it) and picks the tokens the in-process run picks.
TEST_F(Network, ExactMatchOverGrpcDecodesWithTheServersCache) {
  StartServer();
  Dataset data;
  data.name = "past-tense";
  for (const char* v : {"walk", "jump", "talk", "play", "call", "look"}) {
    data.train.push_back({std::string("past tense of ") + v + ":", std::string(v) + "ed", -1});
  }
  data.validation = data.train;
  client::ClientOptions o = ClientFor("client-1", "fp32", 2);
  o.eval_batch = 3;
  o.eval_examples = 6;
  const auto record = [](const StepInput& input, const StepResult& r, std::vector<int64_t>* tokens, int* cached) {
    if (input.kind != StepKind::kNextToken) return;
    tokens->insert(tokens->end(), r.next_tokens.begin(), r.next_tokens.end());
    *cached += input.cache != DecodeCache::kNone;
  };
  RecordingSteps<client::GrpcTransport> grpc_transport(ClientTransport(testing::kToken1, port_));
  std::vector<int64_t> over_grpc, in_process;
  int cached_grpc = 0, cached_local = 0;
  grpc_transport.on_step = [&](const StepInput& in, const StepResult& r) { record(in, r, &over_grpc, &cached_grpc); };
  client::SplitClient remote(o, data, grpc_transport);
  for (int64_t step = remote.Join(); step < 2; ++step) remote.TrainStep(step);
  EXPECT_TRUE(grpc_transport.server_decodes_with_cache());
  remote.Evaluate();

  server::SplitServer server(testing::TinyServerOptions(*model_));
  RecordingSteps<inproc::LocalTransport> local_transport(server);
  local_transport.on_step = [&](const StepInput& in, const StepResult& r) { record(in, r, &in_process, &cached_local); };
  client::SplitClient local(o, data, local_transport);
  for (int64_t step = local.Join(); step < 2; ++step) local.TrainStep(step);
  local.Evaluate();
  ASSERT_FALSE(over_grpc.empty());
  EXPECT_EQ(over_grpc, in_process);
  EXPECT_GT(cached_grpc, 0);
  EXPECT_EQ(cached_grpc, cached_local);
}

TEST_F(Network, InProcessRunCountsTheMessageBytesOfTheNetworkRun) {
  StartServer();
  const auto run = [&](client::Transport& transport) {
    client::SplitClient c(ClientFor("client-1", "amaq:budget=4", 12), testing::ParityDataset(16), transport);
    c.Run();
    return std::make_pair(transport.bytes_up(), transport.bytes_down());
  };
  client::GrpcOptions messages = ClientTransport(kToken1, port_);
  messages.meter = false;
  client::GrpcTransport network(messages);
  const auto over_grpc = run(network);
  StopServer();

  server::SplitServer in_process(testing::TinyServerOptions(*model_));
  inproc::LocalTransport local(in_process, 4096);  // the fixture's service chunks at 4096 bytes
  const auto counted = run(local);
  EXPECT_EQ(counted.first, over_grpc.first) << "message bytes up";
  EXPECT_EQ(counted.second, over_grpc.second) << "message bytes down";
  EXPECT_GT(counted.first, 12u * 4096) << "every step's activation is counted";

  StartServer();
  client::GrpcTransport socket(ClientTransport(kToken1, port_));  // metered at the socket
  const auto at_socket = run(socket);
  EXPECT_GE(at_socket.first, counted.first);
  EXPECT_GE(at_socket.second, counted.second);
  // A few kB of handshake and headers, and a TLS record and an HTTP/2 frame header per message.
  EXPECT_LE(at_socket.first, counted.first * 1.10 + 16384);
  EXPECT_LE(at_socket.second, counted.second * 1.10 + 16384);
}

ErrorCode JoinError(client::GrpcOptions g, const std::string& client_id, const std::string& fingerprint) {
  try {
    client::GrpcTransport transport(g);
    transport.Join(JoinInfo{client_id, fingerprint, 2, "bf16", "", RunStart::kContinue});
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

// grpc.health.v1.Health/Check with `request` (a serialized HealthCheckRequest), as a generic
// probe sends it: no token, no generated stub. Returns the status and the reply's bytes.
std::pair<grpc::Status, std::string> HealthCheck(const std::shared_ptr<grpc::Channel>& channel, const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::Slice slice(request);
  grpc::ByteBuffer sent(&slice, 1), reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &sent, &reply,
                 [&done](grpc::Status status) { done.set_value(status); });
  const grpc::Status status = done.get_future().get();
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (status.ok() && reply.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return {status, bytes};
}

// Load balancers and generic gRPC tools can probe the server: the standard health service answers
// SERVING for the server as a whole (field 1 = 1) without a token, and NOT_FOUND for a service it
// does not know, as grpc.health.v1 specifies.
TEST_F(Network, TheStandardHealthServiceAnswersWithoutAToken) {
  StartServer();
  const auto [status, reply] = HealthCheck(RawChannel(), "");
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
  EXPECT_EQ(HealthCheck(RawChannel(), std::string("\x0a\x07unknown", 9)).first.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Generic gRPC tools learn the server's services by reflection: ServerReflectionInfo with a
// ServerReflectionRequest{list_services: ""} (field 7) lists SplitTraining and the health service.
TEST_F(Network, ReflectionListsTheServices) {
  StartServer();
  grpc::GenericStub stub(RawChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue queue;
  const auto call = stub.PrepareCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  const auto await = [&queue](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), expected);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(await(1));
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1), reply;
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(await(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(await(3));
  call->Read(&reply, reinterpret_cast<void*>(4));
  ASSERT_TRUE(await(4)) << "no reflection reply";
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  EXPECT_TRUE(await(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("amaq.v1.SplitTraining"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
}

TEST_F(Network, UnauthenticatedClientsAreRefused) {
  StartServer();
  const std::string fp = ModelFingerprint(*model_, 2);
  EXPECT_EQ(JoinError(ClientTransport("", port_), "client-1", fp), ErrorCode::kUnauthenticated);
  EXPECT_EQ(JoinError(ClientTransport("not-a-valid-token-0123456789", port_), "client-1", fp), ErrorCode::kUnauthenticated);
  EXPECT_EQ(JoinError(ClientTransport(kToken2, port_), "client-1", fp), ErrorCode::kUnauthenticated);  // someone else's
  client::GrpcOptions plain = ClientTransport(kToken1, port_);
  plain.insecure = true;
  plain.call_timeout_seconds = 3;
  EXPECT_EQ(JoinError(plain, "client-1", fp), ErrorCode::kUnavailable);  // plain text against TLS
  EXPECT_EQ(JoinError(ClientTransport(kToken1, port_), "client-1", fp), ErrorCode::kInternal);  // accepted
}

// docs/protocol.md, "Runs", over gRPC: the run and start fields reach the server, another run is
// refused naming what differs, FRESH starts the client over, an unknown start is refused.
TEST_F(Network, AJoinOfAnotherRunIsRefusedUnlessItResumesOrStartsFresh) {
  StartServer();
  const auto join = [&](const std::string& run, int start, amaq::v1::JoinReply* reply) {
    grpc::ClientContext context;
    Authorize(&context, kToken1);
    amaq::v1::JoinRequest request;
    request.set_client_id("client-1");
    request.set_model_fingerprint(ModelFingerprint(*model_, 2));
    request.set_cut_layer(2);
    request.set_method("bf16");
    request.set_run(run);
    request.set_start(static_cast<amaq::v1::JoinRequest::RunStart>(start));
    return RawStub()->Join(&context, request, reply);
  };
  amaq::v1::JoinReply reply;
  ASSERT_TRUE(join("task=wordnet seed=1", amaq::v1::JoinRequest::CONTINUE, &reply).ok());
  const grpc::Status other = join("task=wordnet seed=2", amaq::v1::JoinRequest::CONTINUE, &reply);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other.error_message().find("seed 1 -> 2"), std::string::npos) << other.error_message();
  EXPECT_TRUE(join("task=wordnet seed=2", amaq::v1::JoinRequest::RESUME, &reply).ok());
  EXPECT_TRUE(join("task=wordnet seed=2", amaq::v1::JoinRequest::CONTINUE, &reply).ok()) << "resume adopted the run";
  EXPECT_TRUE(join("task=verbs seed=2", amaq::v1::JoinRequest::FRESH, &reply).ok());
  EXPECT_EQ(reply.last_applied_step(), -1);
  EXPECT_EQ(join("task=verbs seed=2", 7, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(join(std::string(1025, 'x'), amaq::v1::JoinRequest::CONTINUE, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(Network, MalformedStepEndsThatStreamOnly) {
  StartServer();
  {
    // A raw client: joins properly, then sends codec bytes that are garbage.
    auto stub = RawStub();
    ASSERT_TRUE(RawJoin(*stub, kToken2, "client-2", "bf16").ok());
    grpc::ClientContext context;
    Authorize(&context, kToken2);
    auto stream = stub->Steps(&context);
    stream->Write(testing::FirstChunk(std::string(300, 'x'), 1));
    stream->WritesDone();
    amaq::v1::StepReply reply;
    EXPECT_FALSE(stream->Read(&reply));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
  }
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::SplitClient c(ClientFor("client-1", "bf16", 5), testing::ParityDataset(16), transport);
  EXPECT_NO_THROW(c.Run());
  EXPECT_EQ(split_->Stats().at("client-1").steps, 5);
}

// The error of one Join.
Error JoinErrorOf(client::GrpcOptions g, const std::string& fingerprint) {
  try {
    client::GrpcTransport transport(g);
    transport.Join(JoinInfo{"client-1", fingerprint, 2, "bf16", "", RunStart::kContinue});
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::kInternal, "joined");
}

// Issue 40 item 3: permanent faults fail at once with the cause and the fix, naming the server the
// user gave (not the local byte meter's address): a certificate from another CA, a name the
// certificate does not hold, a port nothing listens on. (Mutual TLS without a client certificate
// still shows as "Socket closed" and is retried: gRPC's client learns nothing more.)
TEST_F(Network, PermanentConnectionFaultsFailFastNamingTheCause) {
  mutual_tls_ = true;
  StartServer();
  const std::string fp = ModelFingerprint(*model_, 2);
  const std::string server = "127.0.0.1:" + std::to_string(port_);
  const auto expect = [&](const client::GrpcOptions& g, ErrorCode code, const std::string& cause) {
    const Error error = JoinErrorOf(g, fp);  // kFailedPrecondition: the client's retry loop stops
    const std::string m = error.what();
    EXPECT_EQ(error.code(), code) << m;
    EXPECT_NE(m.find(cause), std::string::npos) << m;
    EXPECT_NE(m.find(g.server), std::string::npos) << "names the server given: " << m;
    EXPECT_EQ(m.find("ipv4:127.0.0.1:"), std::string::npos) << "not the byte meter's address: " << m;
  };
  client::GrpcOptions with_certificate = ClientTransport(kToken1, port_);
  with_certificate.tls.cert = *certs_ + "/client-1.pem";
  with_certificate.tls.key = *certs_ + "/client-1.key";

  const std::string other_ca = testing::TempDir("other-ca");
  ASSERT_EQ(std::system((std::string(AMAQ_SOURCE_DIR) + "/scripts/make-certs " + other_ca).c_str()), 0);
  client::GrpcOptions wrong_ca = with_certificate;
  wrong_ca.tls.ca = other_ca + "/ca.pem";
  expect(wrong_ca, ErrorCode::kFailedPrecondition, "tls_ca");
  client::GrpcOptions wrong_name = with_certificate;
  wrong_name.server_name = "gpu-host.example.org";
  expect(wrong_name, ErrorCode::kFailedPrecondition, "tls_server_name");
  client::GrpcOptions nobody = with_certificate;
  nobody.server = "127.0.0.1:1";
  nobody.refused_seconds = 0;  // before a first Join (default 20 s: a server still starting)
  expect(nobody, ErrorCode::kFailedPrecondition, "nothing listens");
  client::GrpcOptions unknown_host = with_certificate;
  unknown_host.server = "no-such-host.invalid:" + std::to_string(port_);
  expect(unknown_host, ErrorCode::kFailedPrecondition, "host name");
  expect(ClientTransport(kToken1, port_), ErrorCode::kFailedPrecondition, "tls_cert");  // mutual TLS without a certificate
  EXPECT_EQ(JoinError(with_certificate, "client-1", fp), ErrorCode::kInternal) << "the right settings join";
}

// Issue 55 item 6: a call that fails while the server is down (fetching its adapter after a
// restart) names the server as the user gave it, not the local byte meter's loopback address.
TEST_F(Network, ACallWhileTheServerIsDownNamesTheServerGiven) {
  StartServer();
  const client::GrpcOptions g = ClientTransport(kToken1, port_);
  client::GrpcTransport transport(g);
  transport.Join(JoinInfo{"client-1", ModelFingerprint(*model_, 2), 2, "bf16", "", RunStart::kContinue});
  StopServer();
  try {
    transport.FetchAdapter();
    ADD_FAILURE() << "fetched an adapter from a server that is down";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << m;
    EXPECT_NE(m.find("fetching the server's adapter"), std::string::npos) << m;
    EXPECT_NE(m.find(g.server), std::string::npos) << "names the server given: " << m;
    EXPECT_EQ(m.find("127.0.0.1:" + std::to_string(transport.relay()->port())), std::string::npos)
        << "not the byte meter's address: " << m;
  }
}

// A client started before its server (or while it restarts) keeps trying to join for
// retry_seconds instead of failing at once.
TEST_F(Network, ClientWaitsForAServerThatIsNotUpYet) {
  StartServer();
  const int port = port_;
  StopServer();
  client::GrpcTransport transport(ClientTransport(kToken1, port));
  client::SplitClient c(ClientFor("client-1", "bf16", 3), testing::ParityDataset(16), transport);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    StartServer("", port);
  });
  EXPECT_NO_THROW(c.Run());
  late.join();
  EXPECT_EQ(split_->Stats().at("client-1").steps, 3);
}

TEST_F(Network, ClientResumesAfterTheServerRestarts) {
  const std::string checkpoints = testing::TempDir("restart");
  StartServer(checkpoints);
  const int port = port_;
  client::GrpcTransport transport(ClientTransport(kToken1, port));
  client::SplitClient c(ClientFor("client-1", "bf16", 8), testing::ParityDataset(48), transport);
  int64_t step = c.Join();
  for (; step < 4; ++step) c.TrainStep(step);
  const float loss_before = c.records().back().loss;
  StopServer();  // a crash after step 3 (checkpoints are written after every step here)
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    StartServer(checkpoints, port);
  });
  const client::StepRecord after = c.TrainStep(step);  // retries with backoff until the server is back
  restart.join();
  EXPECT_EQ(after.step, 4);
  EXPECT_EQ(split_->Stats().at("client-1").steps, 5) << "steps 0-3 restored, step 4 applied once";
  EXPECT_LT(after.loss, c.records().front().loss + 0.5) << "training continued from the checkpoint, not from scratch";
  (void)loss_before;
}

// A client away longer than session_ttl_seconds finds its session as it left it: once its stream
// had closed, the server's watchdog moved the session to checkpoint_dir/sessions, and the Join of
// its return loaded it back (step counter, LoRA).
TEST_F(Network, AnEvictedSessionResumesWhenItsClientReturns) {
  session_ttl_seconds_ = 0.2;
  StartServer(testing::TempDir("evict"));
  const Dataset data = testing::ParityDataset(48);
  const client::ClientOptions options = ClientFor("client-1", "fp32", 4);
  ServerAdapterInfo before;
  {
    client::GrpcTransport transport(ClientTransport(kToken1, port_));
    client::SplitClient c(options, data, transport);
    for (int64_t step = c.Join(); step < 2; ++step) c.TrainStep(step);
    before = split_->AdapterOf("client-1");
  }  // the client leaves: its stream closes
  ASSERT_TRUE(testing::WaitFor([&] { return split_->sessions_in_memory() == 0; }, 30)) << "the idle session is evicted";
  const std::string metrics = server::PrometheusText(*service_);
  EXPECT_EQ(MetricValue(metrics, "amaq_sessions_evicted_total"), 1);
  EXPECT_EQ(MetricValue(metrics, "amaq_sessions_in_memory"), 0);
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::SplitClient back(options, data, transport);
  EXPECT_EQ(back.Join(), 2) << "the server remembers the 2 applied steps";
  EXPECT_EQ(split_->Stats().at("client-1").steps, 2);
  const ServerAdapterInfo after = split_->AdapterOf("client-1");
  for (const auto& [name, t] : before.tensors) EXPECT_EQ(after.tensors.at(name).values, t.values) << name;
  EXPECT_EQ(back.TrainStep(2).step, 2);
  EXPECT_EQ(split_->Stats().at("client-1").steps, 3) << "the step after the return is applied";
}

}  // namespace
}  // namespace amaq

namespace amaq {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The example configurations load, and docs/configuration.md shows every key as --help does.
TEST(Configuration, ExamplesLoadAndTheDocsListEveryKey) {
  const std::string root = AMAQ_SOURCE_DIR;
  const std::string docs = ReadFile(root + "/docs/configuration.md");
  Config server = server::ServerConfig();
  EXPECT_NO_THROW(server.Load(ReadFile(root + "/deploy/config/server.yaml"), "server.yaml", {}));
  EXPECT_NE(docs.find(server::ServerConfig().Help()), std::string::npos)
      << "docs/configuration.md is stale: paste `amaq-server --help` into it";
  Config client = client::ClientConfig();
  EXPECT_NO_THROW(client.Load(ReadFile(root + "/deploy/config/client.yaml"), "client.yaml", {}));
  EXPECT_NE(docs.find(client::ClientConfig().Help()), std::string::npos)
      << "docs/configuration.md is stale: paste `amaq-client --help` into it";
  EXPECT_NE(docs.find(NetemConfig().Help()), std::string::npos)
      << "docs/configuration.md is stale: paste `amaq-netem --help` into it";
}

}  // namespace
}  // namespace amaq
