#include "common/model/finetune.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/model/batching.h"
#include "common/model/checkpoint.h"
#include "common/base/error.h"
#include "common/model/decoders.h"
#include "common/model/evaluate.h"
#include "common/text/sentencepiece_tokenizer.h"
#include "candidate_scores.h"
#include "tiny_model.h"

namespace amaq {
namespace {

using testing::TinyModelDir;

TEST(Batching, LabelsCoverTheCompletionOnly) {
  const std::string dir = TinyModelDir("batching");
  const auto tokenizer = Tokenizer::Load(dir);
  const ExampleEncoder encoder(*tokenizer, 1, 2, 64);
  const Example a{"past tense of walk:", "walked", -1}, b{"dog:", "animal", -1};
  const Batch batch = encoder.MakeBatch({&a, &b}, {10, 11});
  ASSERT_EQ(batch.ids.size(0), 2);
  EXPECT_EQ(batch.sample_ids, (std::vector<uint64_t>{10, 11}));
  const auto pair = encoder.Encode(a.prompt, a.completion);
  const int64_t prompt_len = 1 + static_cast<int64_t>(pair.prompt.size());
  const int64_t total = prompt_len + static_cast<int64_t>(pair.completion.size()) + 1;
  EXPECT_EQ(batch.ids[0][0].item<int64_t>(), 1);  // BOS
  EXPECT_EQ(batch.mask[0].sum().item<int64_t>(), total);
  for (int64_t t = 0; t < batch.ids.size(1); ++t) {
    const int64_t label = batch.labels[0][t].item<int64_t>();
    if (t < prompt_len || t >= total) {
      EXPECT_EQ(label, -100) << t;
    } else {
      EXPECT_EQ(label, batch.ids[0][t].item<int64_t>()) << t;
    }
  }
  EXPECT_EQ(batch.ids[0][total - 1].item<int64_t>(), 2);  // EOS
  EXPECT_EQ(tokenizer->Decode(pair.completion), "walked");

  // Too long: the prompt's beginning is cut, the completion kept.
  const ExampleEncoder short_encoder(*tokenizer, 1, 2, 6);
  const Batch cut = short_encoder.MakeBatch({&a}, {0});
  EXPECT_EQ(cut.ids.size(1), 6);
  EXPECT_EQ(cut.ids[0][0].item<int64_t>(), 1);
  EXPECT_EQ(cut.ids[0][5].item<int64_t>(), 2);
}

TEST(Evaluate, SequenceLogProbsAndArgmax) {
  torch::manual_seed(0);
  const torch::Tensor logits = torch::randn({2, 4, 5});
  const torch::Tensor labels = torch::tensor({{-100, 3, 1, -100}, {-100, -100, 4, 0}});
  const torch::Tensor lp = torch::log_softmax(logits, -1);
  const double row0 = lp[0][0][3].item<double>() + lp[0][1][1].item<double>();
  const double row1 = lp[1][1][4].item<double>() + lp[1][2][0].item<double>();
  const torch::Tensor got = SequenceLogProbs(AtLabels(logits, labels), labels);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_NEAR(got[0][0].item<double>(), row0, 1e-5);
  EXPECT_NEAR(got[1][0].item<double>(), row1, 1e-5);
  const torch::Tensor mask = torch::tensor({{1, 1, 0, 0}, {1, 1, 1, 1}});
  const torch::Tensor next = LastTokenArgmax(logits, mask);
  EXPECT_EQ(next[0].item<int64_t>(), logits[0][1].argmax().item<int64_t>());
  EXPECT_EQ(next[1].item<int64_t>(), logits[1][3].argmax().item<int64_t>());
}

// Scoring every label after one prompt computes what the row (prompt, label) alone gives each
// label: the same log-probabilities as one forward per candidate, with the prompt, the tokens every
// label begins with and the distribution after them computed once.
TEST(Evaluate, CandidateTargetsScoreAsSeparateRows) {
  const std::string dir = TinyModelDir("packed");
  const auto tokenizer = Tokenizer::Load(dir);
  const ModelConfig config = ModelConfig::Load(dir + "/config.json");
  ModelPart model(config, PartSpec::Whole(config));
  LoadPartWeights(model, dir);
  model->eval();
  const Example a{"dog: a domesticated animal\ntopic:", "", 0}, b{"oak:", "", 1};
  // Labels with nothing in common, and labels that all begin alike (one of them is only that).
  const std::vector<std::string> apart = {"animal", "plant", "a domesticated tree", "walked"};
  const std::vector<std::string> alike = {"past tense of walk", "past tense", "past tense of jump"};
  const ExampleEncoder wide(*tokenizer, 1, 2, 64);
  ASSERT_GE(wide.Encode(a.prompt, alike[0]).completion.size(), 3u);
  for (const auto* labels : {&apart, &alike}) {
    // A max_tokens that leaves the prompts whole, and one that cuts two tokens of the longest
    // label's row (the prompt is cut as that row's is).
    size_t longest = 0;
    for (const std::string& l : *labels) {
      const auto pair = wide.Encode(a.prompt, l);
      longest = std::max(longest, pair.prompt.size() + pair.completion.size());
    }
    for (int64_t max_tokens : {int64_t{64}, static_cast<int64_t>(longest)}) {
      EXPECT_TRUE(testing::CandidatesScoreAsSeparateRows(model, *tokenizer, 1, 2, max_tokens, {a, b}, *labels, 1e-5))
          << "max_tokens " << max_tokens;
    }
  }
  // The rows hold fewer tokens than the old packing (each label's segment without the prompt's
  // last token and EOS), and the shared tokens once.
  const CandidateBatch packed = wide.MakeCandidateBatch({&a}, alike);
  const size_t prompt = wide.Encode(a.prompt, alike[0]).prompt.size(), shared = wide.Encode(a.prompt, alike[1]).completion.size();
  int64_t own = 0;
  for (const std::string& l : alike) own += static_cast<int64_t>(wide.Encode(a.prompt, l).completion.size() - shared);
  EXPECT_EQ(packed.ids.size(1), static_cast<int64_t>(1 + prompt + shared) + own);
}

TEST(Evaluate, AccuracyAndExactMatchCountCorrectly) {
  const std::string dir = TinyModelDir("metrics");
  const auto tokenizer = Tokenizer::Load(dir);
  const ExampleEncoder encoder(*tokenizer, 1, 2, 64);
  Dataset d;
  d.labels = {"animal", "plant"};
  d.validation = {{"dog:", "animal", 0}, {"oak:", "plant", 1}, {"cat:", "animal", 0}};
  // A scorer that likes "plant": right on one of three.
  const std::vector<int64_t> plant = encoder.Encode("x", "plant").completion;
  int scored_batches = 0;
  const CandidateScorer prefers_plant = [&](const CandidateBatch& b) {  // one score per candidate
    ++scored_batches;
    torch::Tensor s = torch::zeros({b.ids.size(0), b.targets.count});
    for (size_t i = 0; i < b.targets.positions.size(); ++i) {
      if (b.targets.tokens[i] == plant[0]) s[b.targets.positions[i] / b.ids.size(1)][b.targets.candidates[i]] = 1.0;
    }
    return s;
  };
  EXPECT_NEAR(ClassificationAccuracy(prefers_plant, encoder, d, d.validation, 2, 2048), 1.0 / 3, 1e-9);
  EXPECT_EQ(scored_batches, 2) << "3 examples in batches of 2, both labels in one row";
  // Rows of the fewest positions that hold one label: each label gets rows of its own, same answer.
  int64_t tight = 64;
  while (true) {
    try {
      encoder.CandidateGroups(d.labels, tight);
      break;
    } catch (const Error&) {
      ++tight;
    }
  }
  EXPECT_EQ(encoder.CandidateGroups(d.labels, tight).size(), 2u);
  scored_batches = 0;
  EXPECT_NEAR(ClassificationAccuracy(prefers_plant, encoder, d, d.validation, 2, tight), 1.0 / 3, 1e-9);
  EXPECT_EQ(scored_batches, 4) << "two label groups for each batch";

  // A generator that always spells "walked": right on one of two.
  const std::vector<int64_t> walked = tokenizer->Encode("walked");
  size_t calls = 0;  // batches of one: each example takes walked.size() tokens, then EOS
  const GreedyStep spell = [&](const torch::Tensor& ids, const torch::Tensor&) {
    const size_t k = calls++ % (walked.size() + 1);
    return torch::full({ids.size(0)}, k < walked.size() ? walked[k] : int64_t{2}, torch::kLong);
  };
  const std::vector<Example> gen = {{"past tense of walk:", "walked", -1}, {"past tense of go:", "went", -1}};
  RecomputingDecoder decoder(spell);
  EXPECT_DOUBLE_EQ(ExactMatch(decoder, encoder, gen, 8, 1), 0.5);
}

TEST(Finetune, ShortRunLowersTheLoss) {
  const std::string dir = TinyModelDir("finetune");
  const Dataset d = testing::ParityDataset(40);
  FinetuneOptions o;
  o.model_dir = dir;
  o.steps = 60;
  o.batch = 8;
  o.lr = 2e-2;
  o.eval_examples = 5;
  o.progress = false;
  o.lora.rank = 8;
  o.lora.alpha = 16;
  o.lora.target_modules = {"q_proj", "v_proj", "up_proj", "down_proj"};
  const FinetuneResult r = FinetuneLocal(d, o);
  ASSERT_EQ(r.losses.size(), 60u);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += r.losses[i] / 10;
    last += r.losses[50 + i] / 10;
  }
  EXPECT_LT(last, 0.7 * first) << first << " -> " << last;
}

TEST(ExampleOrderTest, VisitsEveryExampleOncePerEpoch) {
  ExampleOrder order(10, 5);
  std::vector<size_t> seen = order.Next(10);
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(ExampleOrder(10, 5).Next(10), ExampleOrder(10, 5).Next(10));
}

}  // namespace
}  // namespace amaq
