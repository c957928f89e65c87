// What a hostile or broken client can do to a server over gRPC + TLS, and what a broken link does
// to training: each is refused with a clear status or survived, and no training state changes
// that should not (no step lost, none applied twice).
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "network_fixture.h"
#include "process.h"
#include "quant/checksum.h"
#include "quant/codec.h"

namespace amaq {
namespace {

using testing::kToken1;
using testing::kToken2;
using testing::Network;
using amaq::v1::StepReply;
using amaq::v1::StepRequest;
using testing::FirstChunk;
using testing::SendSteps;

TEST_F(Network, RevokedTokenIsRefusedOnTheNextStepAndCall) {
  StartServer();
  auto stub = RawStub();
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::SplitClient c(ClientFor("client-1", "bf16", 4), testing::ParityDataset(16), transport);
  c.TrainStep(c.Join());  // the step stream is open
  const std::string saved = [&] {
    std::ifstream in(*tokens_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  std::ofstream(*tokens_) << "client-2 " << kToken2 << "\n";  // the operator revokes client-1
  std::filesystem::last_write_time(*tokens_, std::filesystem::file_time_type::clock::now() + std::chrono::seconds(2));
  try {
    c.TrainStep(1);
    ADD_FAILURE() << "a step on a stream opened before the revocation must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthenticated) << e.what();
  }
  EXPECT_EQ(split_->Stats().at("client-1").steps, 1);
  const grpc::Status revoked = RawJoin(*stub, kToken1, "client-1", "bf16");
  std::ofstream(*tokens_) << saved;
  std::filesystem::last_write_time(*tokens_, std::filesystem::file_time_type::clock::now() + std::chrono::seconds(4));
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED) << revoked.error_message();
  EXPECT_TRUE(RawJoin(*stub, kToken2, "client-2", "bf16").ok()) << "other clients keep their access";
}

TEST_F(Network, OversizedChunksAreRefused) {
  StartServer();
  auto stub = RawStub();
  ASSERT_TRUE(RawJoin(*stub, kToken2, "client-2", "bf16").ok());
  // Above max_chunk_bytes (4096 here).
  grpc::Status status = SendSteps(*stub, {FirstChunk(std::string(4097, 'x'), 1)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  // Above gRPC's message limit: refused before it reaches the service.
  status = SendSteps(*stub, {FirstChunk(std::string(5 << 20, 'x'), 1)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_EQ(split_->Stats().at("client-2").steps, 0);
}

TEST_F(Network, EndlessChunkedStepIsCutOffAtTheStepLimit) {
  max_batch_tokens_ = 64;  // one step may hold 64 x hidden x 4 bytes + 1 MiB of metadata room
  StartServer();
  auto stub = RawStub();
  ASSERT_TRUE(RawJoin(*stub, kToken2, "client-2", "bf16").ok());
  grpc::ClientContext context;
  Network::Authorize(&context, kToken2);
  auto stream = stub->Steps(&context);
  const uint64_t limit = service_->limits().max_step_bytes;
  int sent = 0;
  StepRequest chunk = FirstChunk(std::string(4096, 'x'), 4096);
  while (sent < 4096 && stream->Write(chunk)) {
    chunk = StepRequest();
    chunk.set_chunk_count(4096);
    chunk.set_chunk_index(++sent);
    chunk.set_payload(std::string(4096, 'x'));
  }
  StepReply reply;
  EXPECT_FALSE(stream->Read(&reply));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_LT(sent, 4095) << "the server must end the stream before the 16 MiB the client announced";
  EXPECT_NE(status.error_message().find(std::to_string(limit)), std::string::npos) << "the message names the limit";
  EXPECT_EQ(split_->Stats().at("client-2").steps, 0);
}

TEST_F(Network, MalformedProtobufsEndTheCallAndTheServerServesOn) {
  StartServer();
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                           MakeChannelCredentials(TlsFiles{"", "", *certs_ + "/ca.pem"}, false), args);
  grpc::GenericStub generic(channel);
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
  {  // a unary call
    grpc::ClientContext context;
    Network::Authorize(&context, kToken2);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, "/amaq.v1.SplitTraining/Join", grpc::StubOptions(), &request, &response,
                      [&done](grpc::Status s) { done.set_value(s); });
    const grpc::Status status = done.get_future().get();
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << "the server must not have gone away";
  }
  {  // the step stream
    grpc::CompletionQueue cq;
    grpc::ClientContext context;
    Network::Authorize(&context, kToken2);
    auto call = generic.PrepareCall(&context, "/amaq.v1.SplitTraining/Steps", &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    call->Write(request, reinterpret_cast<void*>(2));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    call->Read(&response, reinterpret_cast<void*>(3));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_FALSE(ok) << "no reply to a message that does not parse";
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    // gRPC reports a message that does not parse to the service as the end of the client's
    // writes, so the stream ends without a reply (and without an error of its own).
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::SplitClient c(ClientFor("client-1", "bf16", 3), testing::ParityDataset(16), transport);
  EXPECT_NO_THROW(c.Run());
  EXPECT_EQ(split_->Stats().at("client-1").steps, 3);
}

TEST_F(Network, NonFiniteActivationsAreRefusedWithTheReason) {
  StartServer();
  auto stub = RawStub();
  ASSERT_TRUE(RawJoin(*stub, kToken2, "client-2", "fp32").ok());
  const int64_t hidden = split_->config().hidden_size;
  for (const float bad : {std::nanf(""), INFINITY}) {
    // Encoders refuse non-finite values, so patch one into a valid fp32 message and reseal it.
    std::vector<float> values(static_cast<size_t>(2 * hidden), 0.5f);
    quant::EncodeOptions o;
    o.scheme = quant::Scheme::kFloat32;
    quant::Encoder encoder;
    std::vector<uint8_t> bytes = encoder.Encode(values.data(), 2, hidden, quant::BitsTable{}, o).bytes;
    std::memcpy(bytes.data() + bytes.size() - 8 - 4 * 3, &bad, 4);
    const uint64_t sum = quant::WireChecksum(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    const grpc::Status status = SendSteps(*stub, {FirstChunk(std::string(bytes.begin(), bytes.end()), 1)});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("finite"), std::string::npos) << status.error_message();
  }
  EXPECT_EQ(split_->Stats().at("client-2").steps, 0) << "training state untouched";
}

TEST_F(Network, LinkResetMidMessageRetriesTheStepAndAppliesItOnce) {
  StartServer();
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::SplitClient c(ClientFor("client-1", "bf16", 12), testing::ParityDataset(48), transport);
  int64_t step = c.Join();
  for (; step < 12; ++step) {
    // A bf16 step uploads ~10 KB in 4 KB chunks: the reset cuts its upload or its reply.
    if (step % 3 == 2) transport.relay()->ResetAfter(3000);
    c.TrainStep(step);
  }
  EXPECT_EQ(transport.relay()->resets(), 4u);
  EXPECT_EQ(split_->Stats().at("client-1").steps, 12) << "each step applied once";
  EXPECT_EQ(Losses(c), LossesWithoutNetwork(ClientFor("client-1", "bf16", 12), testing::ParityDataset(48)));
}

// Steps sent in two parts over a link that breaks in the upload of a part, between the parts and
// in a part's reply: each part is sent again (one the server already has is answered from its
// store, not added twice: step 8's first part here), every step is applied once, and the losses
// are exactly those of the same parts without a network (SplitTraining.MicroBatchesGiveTheUpdate-
// OfTheWholeStep compares parts with whole steps).
TEST_F(Network, LinkResetsBetweenMicroBatchesLoseAndRepeatNoPart) {
  StartServer();
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::ClientOptions o = ClientFor("client-1", "fixed:4:channel", 12);
  o.micro_batches = 2;
  client::SplitClient c(o, testing::ParityDataset(48), transport);
  int64_t step = c.Join();
  for (; step < 12; ++step) {
    // A 4-bit part is ~1 KB each way: these cut part 0's upload, its reply, part 1's upload and
    // part 1's reply.
    if (step % 3 == 2) transport.relay()->ResetAfter(static_cast<uint64_t>(500 + 1200 * (step / 3)));
    c.TrainStep(step);
  }
  EXPECT_EQ(transport.relay()->resets(), 4u);
  EXPECT_EQ(split_->Stats().at("client-1").steps, 12) << "each step applied once";
  EXPECT_EQ(Losses(c), LossesWithoutNetwork(o, testing::ParityDataset(48)));
}

// One step stale (two steps in flight) over a link that breaks four times: the unanswered parts of
// both steps are sent again (those the server has, answered from its store of its last two applied
// steps), every step is applied once, and with the client's learning rate 0 (its weights never
// move, so being stale changes nothing) the losses are exactly those of serial steps without a
// network. The resets are armed by bytes, one after the other, wherever the run is by then.
TEST_F(Network, OneStepStaleStepsSurviveLinkResets) {
  StartServer();
  client::GrpcTransport transport(ClientTransport(kToken1, port_));
  client::ClientOptions o = ClientFor("client-1", "fixed:4:channel", 12);
  o.micro_batches = 2;
  o.lr = 0;
  o.one_step_stale = true;
  client::SplitClient c(o, testing::ParityDataset(48), transport);
  std::atomic<bool> done{false};
  std::thread faults([&] {
    for (uint64_t k = 0; k < 4 && !done; ++k) {
      transport.relay()->ResetAfter(8000 + 4000 * k);
      while (transport.relay()->resets() == k && !done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  c.Run();
  done = true;
  faults.join();
  EXPECT_EQ(transport.relay()->resets(), 4u);
  EXPECT_EQ(split_->Stats().at("client-1").steps, 12) << "each step applied once";
  std::vector<float> losses = Losses(c);
  losses.resize(12);  // the run's last record repeats the last step with the final metric
  EXPECT_EQ(losses, LossesWithoutNetwork(o, testing::ParityDataset(48)));
}

TEST_F(Network, StalledClientIsTimedOutAndOthersKeepTraining) {
  stall_timeout_seconds_ = 0.5;
  StartServer();
  auto stub = RawStub();
  ASSERT_TRUE(RawJoin(*stub, kToken2, "client-2", "bf16").ok());
  grpc::ClientContext context;
  Network::Authorize(&context, kToken2);
  auto stalled = stub->Steps(&context);
  ASSERT_TRUE(stalled->Write(FirstChunk(std::string(100, 'x'), 3)));  // chunk 1 of 3, then nothing
  const auto started = std::chrono::steady_clock::now();
  {
    client::GrpcTransport transport(ClientTransport(kToken1, port_));
    client::SplitClient c(ClientFor("client-1", "bf16", 6), testing::ParityDataset(48), transport);
    c.Run();
  }
  StepReply reply;
  EXPECT_FALSE(stalled->Read(&reply));
  const grpc::Status status = stalled->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 20.0);
  EXPECT_TRUE(testing::WaitFor([&] { return service_->open_streams() == 0; }, 5)) << "the stalled stream was freed";
  EXPECT_EQ(split_->Stats().at("client-1").steps, 6);
  EXPECT_EQ(split_->Stats().at("client-2").steps, 0);
}

TEST_F(Network, LinkStallLongerThanTheTimeoutLosesNoStep) {
  stall_timeout_seconds_ = 0.3;
  StartServer();
  client::GrpcOptions g = ClientTransport(kToken1, port_);
  g.call_timeout_seconds = 1.0;
  client::GrpcTransport transport(g);
  client::SplitClient c(ClientFor("client-1", "bf16", 10), testing::ParityDataset(48), transport);
  int64_t step = c.Join();
  for (; step < 10; ++step) {
    // The link freezes in the middle of step 4's upload, for longer than both timeouts: the server
    // drops the half-received step, the client gives up on it and retries once the link is back.
    if (step == 4) transport.relay()->StallAfter(3000, 1.5);
    c.TrainStep(step);
  }
  EXPECT_EQ(split_->Stats().at("client-1").steps, 10);
  EXPECT_EQ(Losses(c), LossesWithoutNetwork(ClientFor("client-1", "bf16", 10), testing::ParityDataset(48)));
  EXPECT_GT(c.records()[4].seconds, 1.0) << "step 4 waited out the stall";
}

// Load: 8, then 16 clients at once, each on its own channel; nothing fails and every step of
// every client is applied exactly once. (Throughput and memory figures: bench/bench_load.cc.)
TEST_F(Network, EightAndSixteenConcurrentClientsAllFinish) {
  use_tokens_ = false;
  StartServer();
  for (int clients : {8, 16}) {
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        try {
          client::GrpcTransport transport(ClientTransport("", port_));
          client::SplitClient c(ClientFor("load-" + std::to_string(clients) + "-" + std::to_string(i), "amaq:8->3", 4),
                                testing::ParityDataset(32), transport);
          int64_t step = c.Join();
          for (; step < 4; ++step) c.TrainStep(step);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "client " << i << ": " << e.what();
          ++failed;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failed.load(), 0);
    const auto stats = split_->Stats();
    for (int i = 0; i < clients; ++i) {
      EXPECT_EQ(stats.at("load-" + std::to_string(clients) + "-" + std::to_string(i)).steps, 4);
    }
  }
}

}  // namespace
}  // namespace amaq
