// MicroBatchChoice: the count of parts a step goes in when micro_batches is auto, from measured
// step times (client/micro_batch_choice.h).
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "client/micro_batch_choice.h"
#include "common/base/error.h"

namespace amaq::client {
namespace {

// Runs steps until the choice is made, each taking what `seconds` says for its parts; returns the
// parts of every step, in order.
std::vector<int64_t> StepsUntilChosen(MicroBatchChoice& choice, const std::function<double(int64_t)>& seconds) {
  std::vector<int64_t> parts;
  for (int step = 0; step < 100 && !choice.chosen(); ++step) {
    parts.push_back(choice.Next());
    choice.Took(parts.back(), seconds(parts.back()));
  }
  return parts;
}

TEST(MicroBatchChoice, OverANetworkEachCountIsTriedAndTheFastestKept) {
  // A slow link: 10 Mbit/s in docs/benchmarks.md (serial bf16 0.83 s a step, 4 parts 0.19 s, 8 parts 0.21 s).
  const std::map<int64_t, double> link{{1, 0.83}, {2, 0.47}, {4, 0.19}, {8, 0.21}};
  MicroBatchChoice choice(MicroBatchChoice::kAuto, 16, true);
  EXPECT_FALSE(choice.chosen());
  const std::vector<int64_t> parts = StepsUntilChosen(choice, [&](int64_t n) { return link.at(n); });
  // One unmeasured step, then the candidates in turn, kRounds times round.
  std::vector<int64_t> expected{1};
  for (int round = 0; round < MicroBatchChoice::kRounds; ++round) expected.insert(expected.end(), {1, 2, 4, 8});
  EXPECT_EQ(parts, expected);
  ASSERT_TRUE(choice.chosen());
  EXPECT_EQ(choice.Next(), 4);
  EXPECT_EQ(choice.Describe(), "4 parts (median s/step: 1 part 0.830, 2 parts 0.470, 4 parts 0.190, 8 parts 0.210)");
  choice.Took(4, 5.0);  // once chosen, later steps do not move it
  EXPECT_EQ(choice.Next(), 4);
}

TEST(MicroBatchChoice, TheMedianDiscountsSlowStepsAndNearTiesGoToFewerParts) {
  MicroBatchChoice choice(MicroBatchChoice::kAuto, 16, true);
  int whole = 0;
  // A fast link: whole steps 0.200 s, except two 0.9 s hiccups; 2 parts 0.198 s (within 3%), 4 and 8 slower.
  StepsUntilChosen(choice, [&](int64_t n) {
    if (n == 1) return ++whole == 2 || whole == 4 ? 0.9 : 0.200;  // the first whole step is the unmeasured one
    return n == 2 ? 0.198 : 0.25;
  });
  EXPECT_EQ(choice.Next(), 1);
}

TEST(MicroBatchChoice, TheCandidatesStopAtTheBatchsRows) {
  MicroBatchChoice choice(MicroBatchChoice::kAuto, 3, true);
  const std::vector<int64_t> parts = StepsUntilChosen(choice, [](int64_t n) { return 1.0 / static_cast<double>(n); });
  EXPECT_EQ(parts, (std::vector<int64_t>{1, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(choice.Next(), 2);
  MicroBatchChoice one_row(MicroBatchChoice::kAuto, 1, true);
  EXPECT_TRUE(one_row.chosen());
  EXPECT_EQ(one_row.Next(), 1);
}

TEST(MicroBatchChoice, InOneProcessAutoIsWholeStepsAndAFixedCountStays) {
  MicroBatchChoice in_process(MicroBatchChoice::kAuto, 16, false);
  EXPECT_TRUE(in_process.chosen());
  EXPECT_EQ(in_process.Next(), 1);
  MicroBatchChoice fixed(8, 16, true);
  EXPECT_TRUE(fixed.chosen());
  fixed.Took(8, 1.0);
  fixed.Remeasure();
  EXPECT_EQ(fixed.Next(), 8);
}

TEST(MicroBatchChoice, AReconnectionMeasuresAgain) {
  MicroBatchChoice choice(MicroBatchChoice::kAuto, 16, true);
  StepsUntilChosen(choice, [](int64_t n) { return n == 8 ? 0.1 : 0.5; });
  EXPECT_EQ(choice.Next(), 8);
  choice.Remeasure();  // a new path on which whole steps are fastest
  EXPECT_FALSE(choice.chosen());
  const std::vector<int64_t> parts = StepsUntilChosen(choice, [](int64_t n) { return n == 1 ? 0.1 : 0.5; });
  EXPECT_EQ(parts.size(), 1u + 4 * MicroBatchChoice::kRounds) << "the unmeasured step and the rounds again";
  EXPECT_EQ(choice.Next(), 1);
}

TEST(MicroBatchChoice, TheKeyTakesAutoOrACountAndNamesWhatItTakes) {
  EXPECT_THROW(MicroBatchChoice(65, 16, true), Error);  // a count set in code, not through the key
  EXPECT_THROW(MicroBatchChoice(-1, 16, false), Error);
  EXPECT_EQ(ParseMicroBatches("auto"), MicroBatchChoice::kAuto);
  EXPECT_EQ(ParseMicroBatches("1"), 1);
  EXPECT_EQ(ParseMicroBatches("64"), 64);
  for (const char* bad : {"0", "65", "-2", "4x", "", "Auto", "2.5"}) {
    try {
      ParseMicroBatches(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("give auto"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace amaq::client
