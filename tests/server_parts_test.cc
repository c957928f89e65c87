// Parts of the server's network side on their own: the StepAssembler (chunks to steps), the
// TokenStore (bearer tokens from a file, reloaded when it changes), FetchAdapter's parts and the
// adapter average.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "common/base/error.h"
#include "proto/step_messages.h"
#include "server/adapter_average.h"
#include "server/run_history.h"
#include "server/step_assembler.h"
#include "server/token_store.h"

namespace amaq::server {
namespace {

StepLimits Limits() {
  StepLimits limits;
  limits.max_chunk_bytes = 8;
  limits.max_chunks = 4;
  limits.max_step_bytes = 20;
  limits.shape.vocab_size = 100;
  return limits;
}

StepInput TrainStep(int64_t step_id, size_t activation_bytes) {
  StepInput in;
  in.step_id = step_id;
  in.batch = 1;
  in.tokens = 2;
  in.mask = {1, 1};
  in.labels = {-100, 5};
  in.sample_ids = {3};
  in.activation.resize(activation_bytes);
  for (size_t i = 0; i < activation_bytes; ++i) in.activation[i] = static_cast<uint8_t>(i);
  return in;
}

ErrorCode AddError(StepAssembler& assembler, const v1::StepRequest& chunk) {
  try {
    assembler.Add(chunk);
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

TEST(StepAssembler, ReassemblesAStepFromItsChunks) {
  StepAssembler assembler(Limits());
  const StepInput sent = TrainStep(4, 19);
  const auto chunks = StepRequests(sent, 8);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_FALSE(assembler.Add(chunks[0]));
  EXPECT_TRUE(assembler.partial());
  EXPECT_FALSE(assembler.Add(chunks[1]));
  EXPECT_TRUE(assembler.Add(chunks[2]));
  EXPECT_FALSE(assembler.partial());
  const StepInput got = assembler.Take();
  EXPECT_EQ(got.step_id, 4);
  EXPECT_EQ(got.activation, sent.activation);
  EXPECT_EQ(got.mask, sent.mask);
  EXPECT_EQ(got.labels, sent.labels);
  EXPECT_EQ(got.sample_ids, sent.sample_ids);
}

// Each rule, broken once; the partial step is dropped and the next step assembles.
TEST(StepAssembler, RefusesChunksThatBreakTheRulesAndStartsAfresh) {
  StepAssembler assembler(Limits());
  auto chunks = StepRequests(TrainStep(0, 16), 8);
  EXPECT_EQ(AddError(assembler, chunks[1]), ErrorCode::kInvalidArgument) << "out of order";
  assembler.Add(chunks[0]);
  auto other = chunks[1];
  other.set_step_id(9);
  EXPECT_EQ(AddError(assembler, other), ErrorCode::kInvalidArgument) << "another step's chunk";
  EXPECT_FALSE(assembler.partial());
  auto big = chunks[0];
  big.set_payload(std::string(9, 'x'));
  EXPECT_EQ(AddError(assembler, big), ErrorCode::kInvalidArgument) << "a chunk above max_chunk_bytes";
  auto many = chunks[0];
  many.set_chunk_count(5);
  EXPECT_EQ(AddError(assembler, many), ErrorCode::kInvalidArgument) << "more than max_chunks";
  const auto over = StepRequests(TrainStep(0, 24), 8);  // three full chunks: 24 > 20 bytes
  assembler.Add(over[0]);
  assembler.Add(over[1]);
  EXPECT_EQ(AddError(assembler, over[2]), ErrorCode::kResourceExhausted) << "above max_step_bytes";
  StepInput bad_fields = TrainStep(0, 4);
  bad_fields.labels[1] = 100;  // the vocabulary has 100 tokens
  EXPECT_EQ(AddError(assembler, StepRequests(bad_fields, 8)[0]), ErrorCode::kInvalidArgument) << "fields";
  EXPECT_FALSE(assembler.partial());
  for (const auto& chunk : chunks) assembler.Add(chunk);
  EXPECT_EQ(assembler.Take().activation.size(), 16u);
}

class TokenStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/amaq-tokens-" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/tokens";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Writes the file and moves its time forward, so that the change shows on any file system.
  void Write(const std::string& text) {
    std::ofstream(path_) << text;
    stamp_ += std::chrono::seconds(1);
    std::filesystem::last_write_time(path_, stamp_);
  }
  std::string dir_, path_;
  std::filesystem::file_time_type stamp_ = std::filesystem::file_time_type::clock::now();
};

// FetchAdapter's stream: whole tensors in parts closed at the bound, the settings in the first.
TEST(ServerAdapterParts, SplitAtTheBoundAndJoinBackWithTheTotalBounded) {
  ServerAdapterInfo info;
  info.lora_rank = 8;
  info.lora_alpha = 16;
  info.target_modules = {"q_proj"};
  info.applied_steps = 5;
  for (int i = 0; i < 5; ++i) info.tensors["t" + std::to_string(i)] = NamedFloat{{100}, std::vector<float>(100, i + 0.5f)};
  const std::vector<v1::ServerAdapter> parts = ServerAdapterParts(info, 800);  // two tensors a part
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].tensors_size(), 2);
  EXPECT_EQ(parts[2].tensors_size(), 1);
  ServerAdapterInfo back;
  for (size_t i = 0; i < parts.size(); ++i) AddServerAdapterPart(parts[i], i, &back);
  EXPECT_EQ(back.lora_rank, 8);
  EXPECT_EQ(back.applied_steps, 5);
  EXPECT_EQ(back.target_modules, info.target_modules);
  for (const auto& [name, t] : info.tensors) EXPECT_EQ(back.tensors.at(name).values, t.values) << name;

  ServerAdapterInfo twice;
  AddServerAdapterPart(parts[0], 0, &twice);
  const auto code_of = [](const std::function<void()>& f) -> std::optional<ErrorCode> {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code_of([&] { AddServerAdapterPart(parts[0], 1, &twice); }), ErrorCode::kDataLoss) << "a tensor sent twice";
  ServerAdapterInfo past, at;
  EXPECT_EQ(code_of([&] { AddServerAdapterPart(parts[0], 0, &past, 799); }), ErrorCode::kDataLoss) << "past the bound";
  EXPECT_EQ(code_of([&] { AddServerAdapterPart(parts[0], 0, &at, 800); }), std::nullopt) << "at the bound";
}

TEST_F(TokenStoreTest, NamesTheOwnerOfEachTokenAndIgnoresBadLines) {
  Write("# clients\nclient-1 aaaaaaaaaaaaaaaa\noperator bbbbbbbbbbbbbbbb admin\nshort tooshort\n"
        "client-2 cccccccccccccccc boss\n");
  TokenStore tokens(path_);
  EXPECT_TRUE(tokens.enabled());
  const auto one = tokens.OwnerOf("aaaaaaaaaaaaaaaa");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->client, "client-1");
  EXPECT_FALSE(one->admin);
  EXPECT_TRUE(tokens.OwnerOf("bbbbbbbbbbbbbbbb")->admin);
  EXPECT_FALSE(tokens.OwnerOf("tooshort")) << "tokens under 16 characters are ignored";
  EXPECT_FALSE(tokens.OwnerOf("cccccccccccccccc")) << "an unknown role is ignored";
  EXPECT_FALSE(tokens.OwnerOf(""));
}

TEST_F(TokenStoreTest, ReloadsOnChangeAndFailsClosedWhenTheFileIsGone) {
  Write("client-1 aaaaaaaaaaaaaaaa\nclient-2 dddddddddddddddd\n");
  TokenStore tokens(path_);
  EXPECT_TRUE(tokens.OwnerOf("dddddddddddddddd"));
  Write("client-1 aaaaaaaaaaaaaaaa\n");  // client-2 revoked
  EXPECT_FALSE(tokens.OwnerOf("dddddddddddddddd"));
  EXPECT_TRUE(tokens.OwnerOf("aaaaaaaaaaaaaaaa"));
  std::filesystem::remove(path_);
  EXPECT_FALSE(tokens.OwnerOf("aaaaaaaaaaaaaaaa")) << "a deleted file revokes every token";
  Write("client-1 aaaaaaaaaaaaaaaa\n");
  EXPECT_TRUE(tokens.OwnerOf("aaaaaaaaaaaaaaaa")) << "and the file's return restores them";
}

TEST_F(TokenStoreTest, RefusesAMissingOrEmptyFileAtStart) {
  EXPECT_THROW(TokenStore{path_}, Error);
  Write("# nobody\n");
  EXPECT_THROW(TokenStore{path_}, Error);
  EXPECT_FALSE(TokenStore("").enabled());
}


// A long run's curve stays bounded, spans the whole run with evenly spaced steps, and keeps the
// latest bit-widths; metrics of another name start another curve.
TEST(RunHistoryTest, CurvesStayBoundedAndSpanTheRun) {
  RunHistory history;
  for (int64_t step = 0; step < 5000; ++step) {
    history.RecordStep("a", {step, 0.1 * static_cast<double>(step), 1.0, 3.0, 0, 0}, {{3, 1.0}});
  }
  history.RecordStep("a", {5000, 500, 1.0, 4.0, 0, 0}, {});  // no widths known: the last ones stay
  const RunHistory::Run a = history.Snapshot().at("a").run;
  ASSERT_LT(a.steps.size(), RunHistory::kMaxPoints);
  EXPECT_GT(a.steps.size(), RunHistory::kMaxPoints / 2 - 2);
  EXPECT_EQ(a.steps.front().step, 0);
  EXPECT_GT(a.steps.back().step, 5000 - a.stride);
  for (size_t i = 1; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].step - a.steps[i - 1].step, a.stride) << i;
  EXPECT_EQ(a.width_shares, (std::map<int, double>{{3, 1.0}}));
  history.RecordMetric("a", {10, 1, 0.5}, "accuracy");
  history.RecordMetric("a", {20, 2, 0.6}, "accuracy");
  EXPECT_EQ(history.Snapshot().at("a").run.metrics.size(), 2u);
  history.RecordMetric("a", {30, 3, 0.1}, "exact_match");
  EXPECT_EQ(history.Snapshot().at("a").run.metrics.size(), 1u);
  EXPECT_EQ(history.Snapshot().count("b"), 0u);
}

// Issue 55 item 2: a Join at step 0 after steps begins a new run, the one before kept apart (the
// newest kEarlierRunsKept); a Join past step 0 (a restart), or at 0 before any step (a rejoin
// after a refused first step), continues the run.
TEST(RunHistoryTest, AJoinAtStepZeroAfterStepsBeginsANewRun) {
  RunHistory history;
  history.RecordJoin("a", "seed=1", 0, 1.0);
  history.RecordJoin("a", "seed=1", 0, 2.0);  // nothing recorded yet: the same run
  history.RecordStep("a", {1, 3, 2.0, 4, 0, 0}, {});
  history.RecordJoin("a", "seed=1 resumed", 1, 4.0);
  history.RecordStep("a", {2, 5, 1.5, 4, 0, 0}, {});
  RunHistory::Client a = history.Snapshot().at("a");
  EXPECT_TRUE(a.earlier.empty());
  EXPECT_EQ(a.run.steps.size(), 2u);
  EXPECT_EQ(a.run.started, 1.0);
  EXPECT_EQ(a.run.identity, "seed=1 resumed");
  for (int run = 2; run <= 2 + static_cast<int>(RunHistory::kEarlierRunsKept); ++run) {
    history.RecordJoin("a", "seed=" + std::to_string(run), 0, 10.0 * run);  // --fresh
    history.RecordMetric("a", {0, 10.0 * run, 0.1 * run}, "accuracy");
  }
  a = history.Snapshot().at("a");
  EXPECT_EQ(a.run.identity, "seed=6");
  EXPECT_TRUE(a.run.steps.empty());
  ASSERT_EQ(a.run.metrics.size(), 1u);
  ASSERT_EQ(a.earlier.size(), RunHistory::kEarlierRunsKept);
  EXPECT_EQ(a.earlier.front().identity, "seed=2") << "the oldest (seed=1 resumed) dropped";
  EXPECT_EQ(a.earlier.back().identity, "seed=5");
  EXPECT_EQ(a.earlier.back().started, 50.0);
}

// Issue 41 item 4: one Byzantine client within the value bounds (an upload of all 1e4) moved a
// plain mean of adapters to about 2000; the trimmed mean (the default), the median and the norm
// bound keep the aggregate with the honest clients.
TEST(AdapterAverage, AByzantineUploadMovesTheMeanButNotTheRobustAggregates) {
  const auto upload = [](std::vector<float> values) {
    return NamedFloats{{"layers.0.q_proj.lora_A", NamedFloat{{2, 2}, std::move(values)}},
                       {"layers.0.q_proj.lora_B", NamedFloat{{1, 2}, {0.5f, -0.5f}}}};
  };
  const std::vector<NamedFloats> honest = {upload({0.9f, 1.0f, -1.0f, 0.2f}), upload({1.0f, 1.1f, -0.9f, 0.1f}),
                                           upload({1.1f, 0.9f, -1.1f, 0.3f}), upload({1.05f, 1.0f, -1.0f, 0.2f})};
  const NamedFloats byzantine = upload({1e4f, 1e4f, 1e4f, 1e4f});
  std::vector<const NamedFloats*> uploads;
  for (const NamedFloats& h : honest) uploads.push_back(&h);
  uploads.push_back(&byzantine);
  const auto first = [&](const AverageOptions& o) { return AggregateAdapters(uploads, honest[0], o).at("layers.0.q_proj.lora_A").values; };

  AverageOptions plain;
  plain.rule = "mean";
  plain.norm_bound = 0;
  EXPECT_GT(first(plain)[0], 1000) << "the plain mean is pulled";
  const std::vector<float> trimmed = first(AverageOptions{});  // trimmed_mean 0.2: one dropped at each end of 5
  EXPECT_NEAR(trimmed[0], (1.0 + 1.05 + 1.1) / 3, 1e-5);
  EXPECT_NEAR(trimmed[2], (-1.0 - 1.0 - 0.9) / 3, 1e-5);
  AverageOptions median;
  median.rule = "median";
  EXPECT_NEAR(first(median)[1], 1.0, 1e-6);
  AverageOptions bounded = plain;  // the mean of uploads scaled to at most 3x the median norm
  bounded.norm_bound = 3;
  const std::vector<float> clipped = first(bounded);
  EXPECT_LT(clipped[0], 2.0f) << "the Byzantine upload is scaled down to 3x the median norm";
  EXPECT_GT(clipped[0], 1.0f);
  EXPECT_EQ(AggregateAdapters(uploads, honest[0], AverageOptions{}).at("layers.0.q_proj.lora_B").shape,
            (std::vector<int64_t>{1, 2}));
  AverageOptions bad;
  bad.rule = "mode";
  EXPECT_THROW(AggregateAdapters(uploads, honest[0], bad), Error);
}

// With fewer than 1 / trim uploads the trimmed mean drops nothing: two clients get their mean.
TEST(AdapterAverage, FewUploadsGetThePlainMean) {
  const NamedFloats threes{{"a", NamedFloat{{2}, {3.0f, 3.0f}}}}, fives{{"a", NamedFloat{{2}, {5.0f, 5.0f}}}};
  EXPECT_EQ(AggregateAdapters({&threes, &fives}, threes, AverageOptions{}).at("a").values, (std::vector<float>{4.0f, 4.0f}));
}

}  // namespace
}  // namespace amaq::server
