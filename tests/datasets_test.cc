#include "common/text/datasets.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/base/error.h"

namespace amaq {
namespace {

const std::string kData = std::string(AMAQ_SOURCE_DIR) + "/data";

std::set<std::string> Prompts(const std::vector<Example>& examples) {
  std::set<std::string> s;
  for (const Example& e : examples) s.insert(e.prompt);
  return s;
}

void ExpectDisjoint(const Dataset& d) {
  const auto train = Prompts(d.train), validation = Prompts(d.validation), test = Prompts(d.test);
  for (const std::string& p : validation) EXPECT_EQ(train.count(p), 0u) << p;
  for (const std::string& p : test) {
    EXPECT_EQ(train.count(p), 0u) << p;
    EXPECT_EQ(validation.count(p), 0u) << p;
  }
}

TEST(Datasets, WordNetTopics) {
  const Dataset d = LoadWordNetTopics(kData);
  ASSERT_EQ(d.labels.size(), 25u);
  EXPECT_EQ(d.labels.front(), "act");
  EXPECT_EQ(d.labels.back(), "time");
  const size_t total = d.train.size() + d.validation.size() + d.test.size();
  EXPECT_GT(total, 81000u);  // 82,115 noun synsets less noun.Tops and a few identical texts
  EXPECT_LT(total, 82064u);
  EXPECT_NEAR(static_cast<double>(d.test.size()) / total, 0.10, 0.01);
  std::set<int> labels;
  for (const Example& e : d.train) {
    labels.insert(e.label);
    EXPECT_EQ(e.completion, d.labels[e.label]);
  }
  EXPECT_EQ(labels.size(), 25u);
  ExpectDisjoint(d);
  bool found_dog = false;
  for (const auto* split : {&d.train, &d.validation, &d.test}) {
    for (const Example& e : *split) {
      if (e.prompt.rfind("dog: a member of the genus Canis", 0) == 0) {
        found_dog = true;
        EXPECT_EQ(e.completion, "animal");
      }
    }
  }
  EXPECT_TRUE(found_dog);
}

TEST(Datasets, VerbPastTenseHoldsOutIrregulars) {
  const Dataset d = LoadVerbPastTense(kData);
  EXPECT_EQ(d.test.size(), 363u);  // 366 irregular lines, 3 of them verbs listed twice
  EXPECT_GT(d.train.size() + d.validation.size(), 8000u);
  for (const Example& e : d.train) EXPECT_EQ(e.completion.substr(e.completion.size() - 2), "ed") << e.prompt;
  bool swing = false;
  for (const Example& e : d.test) swing = swing || (e.prompt == "past tense of swing:" && e.completion == "swung");
  EXPECT_TRUE(swing);
  ExpectDisjoint(d);
}

TEST(Datasets, ArithmeticIsSeededAndCorrect) {
  const Dataset a = MakeArithmetic(3, 100, 20, 20, 7), b = MakeArithmetic(3, 100, 20, 20, 7);
  EXPECT_EQ(a.train.size(), 100u);
  EXPECT_EQ(a.test.size(), 20u);
  EXPECT_EQ(Prompts(a.train), Prompts(b.train));
  EXPECT_NE(Prompts(a.train), Prompts(MakeArithmetic(3, 100, 20, 20, 8).train));
  for (const Example& e : a.train) {
    int x, y;
    ASSERT_EQ(sscanf(e.prompt.c_str(), "%d + %d =", &x, &y), 2);
    EXPECT_EQ(e.completion, std::to_string(x + y));
  }
  ExpectDisjoint(a);
  EXPECT_THROW(MakeArithmetic(1, 100, 0, 0, 1), Error);
}

TEST(Datasets, PretrainingText) {
  const TextCorpus corpus = LoadPretrainingText(kData);
  EXPECT_EQ(corpus.train.size() + corpus.validation.size(), 233u + 140u + 500u);
  EXPECT_GT(corpus.validation.size(), 5u);
  size_t bytes = 0;
  for (const auto& doc : corpus.train) bytes += doc.size();
  EXPECT_GT(bytes, 15u << 20);
  for (const auto& doc : corpus.train) EXPECT_EQ(doc.find("/nn "), std::string::npos) << "Brown tags must be stripped";
}

}  // namespace
}  // namespace amaq
