// max_sessions_memory_mb: one bound on every session's state together (decoding caches, AQ-SGD
// caches, stored replies, per-client LoRA). Many client ids train with AQ-SGD and start decodes;
// the bound holds after every step, the least recently seen sessions move to disk first and come
// back with their Join, and a step that cannot fit is refused leaving its session as it was.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "client/split_client.h"
#include "common/base/error.h"
#include "inproc/local_transport.h"
#include "quant/method.h"
#include "server/split_server.h"
#include "tiny_model.h"

namespace amaq {
namespace {

class SessionsBudget : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TinyModelDir("sessions-budget");
    config_ = ModelConfig::Load(dir_ + "/config.json");
    fingerprint_ = ModelFingerprint(dir_, 2);
  }
  // Two clients train 4 AQ-SGD steps each; then each of `decoders` joins and starts decoding 16
  // sequences of 64 tokens, one after the other. Returns the bytes held after each decoder's step.
  std::vector<uint64_t> Fill(server::SplitServer& server, int decoders) {
    inproc::LocalTransport transport(server);
    for (const std::string id : {"aqsgd-0", "aqsgd-1"}) {
      client::SplitClient(testing::TinyClientOptions(dir_, id, "aqsgd:4", 4), testing::ParityDataset(32), transport).Run();
    }
    std::vector<uint64_t> held;
    for (int i = 0; i < decoders; ++i) {
      const std::string id = "decoder-" + std::to_string(i);
      server.Join(id, fingerprint_, 2, "fp32");
      Decode(server, id, DecodeCache::kStart, 16, 64);
      held.push_back(server.sessions_memory_bytes());
    }
    return held;
  }
  StepResult Decode(server::SplitServer& server, const std::string& id, DecodeCache cache, int64_t batch, int64_t tokens) {
    StepInput in;
    in.kind = StepKind::kNextToken;
    in.cache = cache;
    in.batch = batch;
    in.tokens = tokens;
    in.mask.assign(static_cast<size_t>(batch * tokens), 1);
    in.labels.assign(in.mask.size(), -100);
    const std::vector<float> x(in.mask.size() * static_cast<size_t>(config_.hidden_size), 0.1f);
    in.activation = quant::Method::Parse("fp32")->MakeClientCodec(quant::CodecContext{})->EncodeEvaluation(
        torch::tensor(x).reshape({batch * tokens, config_.hidden_size}));
    return server.Step(id, in);
  }
  server::ServerOptions Options(double budget_mb, const std::string& checkpoint) const {
    server::ServerOptions o = testing::TinyServerOptions(dir_);
    o.max_sessions_memory_mb = budget_mb;
    o.checkpoint_dir = checkpoint.empty() ? "" : testing::TempDir(checkpoint);
    return o;
  }
  ErrorCode CodeOf(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      message_ = e.what();
      return e.code();
    }
    return ErrorCode::kInternal;
  }
  std::string dir_, fingerprint_, message_;
  ModelConfig config_;
};

TEST_F(SessionsBudget, TheLeastRecentlySeenSessionsMoveToDiskFirstAndTheBoundHolds) {
  // Without a bound: what the two AQ-SGD sessions and each decoder hold.
  server::SplitServer unbounded(Options(0, ""));
  const std::vector<uint64_t> free_held = Fill(unbounded, 1);
  const uint64_t decoder = free_held[0] - [&] {
    server::SplitServer only_aqsgd(Options(0, ""));
    Fill(only_aqsgd, 0);
    return only_aqsgd.sessions_memory_bytes();
  }();
  ASSERT_GT(decoder, 16u * 64 * 4) << "a decoding cache holds keys and values of every token";

  const uint64_t budget = free_held[0] + decoder * 3 / 2;  // room for the AQ-SGD sessions and 2.5 decoders
  server::SplitServer server(Options(static_cast<double>(budget) / (1 << 20), "sessions-budget-server"));
  const std::vector<uint64_t> held = Fill(server, 6);
  for (size_t i = 0; i < held.size(); ++i) EXPECT_LE(held[i], budget) << "after decoder " << i;
  // Oldest first: the sessions in memory are the most recently seen ones, in the order they were seen.
  const std::vector<std::string> seen = {"aqsgd-0", "aqsgd-1", "decoder-0", "decoder-1", "decoder-2",
                                         "decoder-3", "decoder-4", "decoder-5"};
  const std::map<std::string, server::ClientStats> stats = server.Stats();
  size_t first_kept = 0;
  while (first_kept < seen.size() && !stats.count(seen[first_kept])) ++first_kept;
  EXPECT_GE(first_kept, 3u) << "both AQ-SGD sessions and the first decoder went to disk";
  for (size_t i = first_kept; i < seen.size(); ++i) EXPECT_TRUE(stats.count(seen[i])) << seen[i] << " was evicted out of order";
  EXPECT_EQ(server.sessions_evicted(), static_cast<int64_t>(first_kept));
  EXPECT_EQ(Decode(server, "decoder-5", DecodeCache::kExtend, 16, 1).next_tokens.size(), 16u) << "its decode goes on";

  // A decode larger than the bound alone (16 times a decoder's cache and more) is refused before
  // anything moves, and the session's decode stays as it was.
  const int64_t evicted = server.sessions_evicted();
  EXPECT_EQ(CodeOf([&] { Decode(server, "decoder-5", DecodeCache::kStart, 256, 64); }), ErrorCode::kResourceExhausted);
  EXPECT_NE(message_.find("raise max_sessions_memory_mb"), std::string::npos) << message_;
  EXPECT_EQ(server.sessions_evicted(), evicted);
  EXPECT_EQ(Decode(server, "decoder-5", DecodeCache::kExtend, 16, 1).next_tokens.size(), 16u);
  EXPECT_LE(server.sessions_memory_bytes(), budget);

  // An evicted AQ-SGD session comes back with its Join and trains on (moving others out in turn).
  inproc::LocalTransport transport(server);
  client::ClientOptions again = testing::TinyClientOptions(dir_, "aqsgd-0", "aqsgd:4", 8);
  again.accept_divergence = true;  // it kept no checkpoint: it replays the server's 4 steps for itself
  client::SplitClient client(again, testing::ParityDataset(32), transport);
  client.Run();
  EXPECT_EQ(server.Stats().at("aqsgd-0").steps, 8);
  EXPECT_LE(server.sessions_memory_bytes(), budget);
}

TEST_F(SessionsBudget, WithoutACheckpointDirAStepPastTheBoundIsRefused) {
  server::SplitServer unbounded(Options(0, ""));
  const uint64_t one = Fill(unbounded, 1)[0];
  server::SplitServer server(Options(static_cast<double>(one + one / 4) / (1 << 20), ""));
  Fill(server, 1);
  server.Join("late", fingerprint_, 2, "fp32");
  EXPECT_EQ(CodeOf([&] { Decode(server, "late", DecodeCache::kStart, 16, 64); }), ErrorCode::kResourceExhausted);
  EXPECT_NE(message_.find("set checkpoint_dir"), std::string::npos) << message_;
  EXPECT_EQ(server.sessions_evicted(), 0);
  EXPECT_EQ(server.sessions_in_memory(), 4u) << "nothing was dropped";
  EXPECT_EQ(Decode(server, "decoder-0", DecodeCache::kExtend, 16, 1).next_tokens.size(), 16u) << "the earlier decode goes on";
}

}  // namespace
}  // namespace amaq
