// Classification scoring on the real models: WordNet's 25 labels scored in one row per example give
// the log-likelihood of each (prompt, label) row alone, on amaq-base and on SmolLM2-135M-Instruct
// (both from models/: scripts/test fetches SmolLM2 and the data first).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "candidate_scores.h"
#include "common/model/checkpoint.h"
#include "common/text/datasets.h"
#include "common/text/tokenizer.h"

namespace amaq {
namespace {

void ExpectWordNetScoresAsSeparateRows(const std::string& model_dir, size_t examples) {
  const std::string dir = std::string(AMAQ_SOURCE_DIR) + "/" + model_dir;
  const auto tokenizer = Tokenizer::Load(dir);
  const ModelConfig config = ModelConfig::Load(dir + "/config.json");
  ModelPart model(config, PartSpec::Whole(config));
  LoadPartWeights(model, dir);
  model->eval();
  const Dataset d = LoadWordNetTopics(std::string(AMAQ_SOURCE_DIR) + "/data");
  ASSERT_GE(d.validation.size(), examples);
  const std::vector<Example> some(d.validation.begin(), d.validation.begin() + static_cast<long>(examples));
  EXPECT_TRUE(testing::CandidatesScoreAsSeparateRows(model, *tokenizer, config.bos_token_id, config.eos_token_id,
                                                     48 /* the study's max_tokens */, some, d.labels, 1e-5));
}

TEST(CandidateScoring, AmaqBaseWordNetScoresAsSeparateRows) { ExpectWordNetScoresAsSeparateRows("models/amaq-base", 32); }

TEST(CandidateScoring, SmolLM2WordNetScoresAsSeparateRows) {
  ExpectWordNetScoresAsSeparateRows("models/smollm2-135m-instruct", 4);
}

}  // namespace
}  // namespace amaq
