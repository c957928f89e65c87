// Incremental decoding with a KV cache, sampling, and text generation.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "common/base/error.h"
#include "common/model/decoders.h"
#include "common/model/generate.h"
#include "common/model/model.h"
#include "common/model/sampling.h"
#include "common/text/tokenizer.h"
#include "tiny_model.h"

namespace amaq {
namespace {

using testing::TinyConfig;

ModelPart TinyWholeWithLora() {
  const ModelConfig c = TinyConfig();
  torch::manual_seed(5);
  ModelPart model(c, PartSpec::Whole(c));
  model->AddLora(testing::AllTargets());
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : model->LoraParameters()) t.normal_(0, 0.1);
  model->eval();
  return model;
}

// Left-padded prompts of 6 and 3 tokens, then 4 more tokens each: every row of every cached call
// equals the same row of one forward over the whole sequence.
TEST(KvCache, IncrementalLogitsEqualTheFullForwardAtEveryPosition) {
  ModelPart model = TinyWholeWithLora();
  const ModelConfig& c = model->config();
  torch::NoGradGuard no_grad;
  const int64_t prompt = 6, extra = 4;
  const torch::Tensor ids = torch::randint(c.vocab_size, {2, prompt + extra}, torch::kLong);
  torch::Tensor mask = torch::ones({2, prompt + extra}, torch::kLong);
  mask[1].slice(0, 0, 3).fill_(0);  // row 1: three tokens of left padding
  const torch::Tensor full = model(ids, mask);

  KvCache cache;
  const torch::Tensor prefill = model->ForwardCached(ids.slice(1, 0, prompt), mask.slice(1, 0, prompt), cache);
  EXPECT_EQ(cache.length(), prompt);
  for (int64_t p = 0; p < prompt; ++p) {
    for (int64_t r = 0; r < 2; ++r) {
      if (mask[r][p].item<int64_t>() == 0) continue;  // padding rows compute nothing anyone reads
      EXPECT_TRUE(torch::allclose(prefill[r][p], full[r][p], 1e-5, 1e-5)) << "prefill row " << r << " position " << p;
    }
  }
  for (int64_t p = prompt; p < prompt + extra; ++p) {
    const torch::Tensor step = model->ForwardCached(ids.slice(1, p, p + 1), mask.slice(1, p, p + 1), cache);
    ASSERT_EQ(step.size(1), 1);
    EXPECT_TRUE(torch::allclose(step.select(1, 0), full.select(1, p), 1e-5, 1e-5)) << "position " << p;
  }
  EXPECT_EQ(cache.length(), prompt + extra);
}

TEST(KvCache, ChunksAfterThePrefillMayBeLongerThanOneToken) {
  ModelPart model = TinyWholeWithLora();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(model->config().vocab_size, {1, 9}, torch::kLong);
  const torch::Tensor mask = torch::ones_like(ids);
  const torch::Tensor full = model(ids, mask);
  KvCache cache;
  model->ForwardCached(ids.slice(1, 0, 4), mask.slice(1, 0, 4), cache);
  const torch::Tensor rest = model->ForwardCached(ids.slice(1, 4), mask.slice(1, 4), cache);
  EXPECT_TRUE(torch::allclose(rest, full.slice(1, 4), 1e-5, 1e-5));
}

TEST(KvCache, RefusesCandidateSegmentsAndAnotherBatch) {
  ModelPart model = TinyWholeWithLora();
  torch::NoGradGuard no_grad;
  KvCache cache;
  const torch::Tensor ids = torch::zeros({2, 3}, torch::kLong);
  EXPECT_THROW(model->ForwardCached(ids, torch::full({2, 3}, 2, torch::kLong), cache), Error);
  model->ForwardCached(ids, torch::ones({2, 3}, torch::kLong), cache);
  EXPECT_THROW(model->ForwardCached(torch::zeros({3, 1}, torch::kLong), torch::ones({3, 1}, torch::kLong), cache), Error);
}

// The cached decoder and the recomputing one (what a split model's server does) pick the same
// tokens for right-padded prompts of different lengths.
TEST(Decoders, CachedAndRecomputingDecodersAgree) {
  ModelPart model = TinyWholeWithLora();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(model->config().vocab_size, {3, 5}, torch::kLong);
  torch::Tensor mask = torch::ones({3, 5}, torch::kLong);
  mask[1].slice(0, 2).fill_(0);
  mask[2].slice(0, 4).fill_(0);
  CachedDecoder cached(model);
  RecomputingDecoder recomputing([&](const torch::Tensor& i, const torch::Tensor& m) { return LastTokenArgmax(model(i, m), m); });
  torch::Tensor a = cached.Start(ids, mask), b = recomputing.Start(ids, mask);
  for (int t = 0; t < 6; ++t) {
    ASSERT_TRUE(torch::equal(a, b)) << "token " << t;
    a = cached.Next(a);
    b = recomputing.Next(b);
  }
  EXPECT_THROW(cached.Start(ids, torch::zeros_like(mask)), Error);
}

TEST(Sampling, GreedyTopKAndTopPKeepWhatTheyShould) {
  at::Generator generator = at::detail::createCPUGenerator(3);
  const torch::Tensor logits = torch::tensor({{0.0f, 3.0f, 1.0f, 2.9f}});
  EXPECT_EQ(SampleTokens(logits, SamplingOptions{}, generator).item<int64_t>(), 1);
  SamplingOptions top2{1.0, 2, 1.0};
  SamplingOptions nucleus{1.0, 0, 0.5};  // token 1 alone holds ~0.47 < 0.5, tokens 1 and 3 ~0.90
  std::set<int64_t> seen_top2, seen_nucleus;
  for (int i = 0; i < 200; ++i) {
    seen_top2.insert(SampleTokens(logits, top2, generator).item<int64_t>());
    seen_nucleus.insert(SampleTokens(logits, nucleus, generator).item<int64_t>());
  }
  EXPECT_EQ(seen_top2, (std::set<int64_t>{1, 3}));
  EXPECT_EQ(seen_nucleus, (std::set<int64_t>{1, 3}));
  SamplingOptions tiny_p{1.0, 0, 0.01};  // the most likely token always stays
  EXPECT_EQ(SampleTokens(logits, tiny_p, generator).item<int64_t>(), 1);
  EXPECT_THROW(SampleTokens(logits, SamplingOptions{-1, 0, 1}, generator), Error);
  EXPECT_THROW(SampleTokens(logits, SamplingOptions{1, 0, 0}, generator), Error);
  EXPECT_THROW(SampleTokens(logits, SamplingOptions{1, -2, 1}, generator), Error);
}

TEST(Sampling, TheSameSeedDrawsTheSameTokens) {
  const torch::Tensor logits = torch::randn({4, 50});
  const SamplingOptions warm{1.5, 0, 1.0};
  at::Generator a = at::detail::createCPUGenerator(11), b = at::detail::createCPUGenerator(11);
  EXPECT_TRUE(torch::equal(SampleTokens(logits, warm, a), SampleTokens(logits, warm, b)));
}

class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new std::string(testing::TinyModelDir("generate")); }
  static void TearDownTestSuite() { delete dir_; }
  static std::string* dir_;
};
std::string* GenerateTest::dir_ = nullptr;

// Greedy generation is the argmax continuation computed without a cache, token for token; the
// stream shows the same text; a stop string ends it before the string.
TEST_F(GenerateTest, GreedyTextIsTheUncachedArgmaxContinuation) {
  const ModelConfig c = ModelConfig::Load(*dir_ + "/config.json");
  ModelPart model(c, PartSpec::Whole(c));
  LoadPartWeights(model, *dir_);
  model->eval();
  const auto tokenizer = Tokenizer::Load(*dir_);
  GenerationOptions o;
  o.max_new_tokens = 8;
  std::string streamed;
  const Generation g = Generate(model, *tokenizer, "past tense of walk:", o, [&](const std::string& s) { streamed += s; });
  EXPECT_EQ(streamed, g.text);

  std::vector<int64_t> ids = {c.bos_token_id};
  for (const int64_t id : tokenizer->Encode("past tense of walk:")) ids.push_back(id);
  std::vector<int64_t> expected;
  torch::NoGradGuard no_grad;
  for (int t = 0; t < 8; ++t) {
    const torch::Tensor x = torch::tensor(ids, torch::kLong).unsqueeze(0);
    const int64_t next = model(x, torch::ones_like(x))[0][-1].argmax().item<int64_t>();
    if (next == c.eos_token_id) break;
    expected.push_back(next);
    ids.push_back(next);
  }
  EXPECT_EQ(g.tokens, expected);
  EXPECT_EQ(g.text, tokenizer->Decode(expected));
  EXPECT_EQ(g.finish, expected.size() == 8u ? "length" : "eos");

  ASSERT_GE(g.text.size(), 2u);
  GenerationOptions stopping = o;
  stopping.stop = {g.text.substr(1, 1)};
  const Generation s = Generate(model, *tokenizer, "past tense of walk:", stopping);
  EXPECT_EQ(s.finish, "stop");
  EXPECT_EQ(s.text, g.text.substr(0, g.text.find(stopping.stop[0])));
  EXPECT_THROW(Generate(model, *tokenizer, [] { std::string text; for (int i = 0; i < 2100; ++i) text += " walk"; return text; }(), o), Error);
}

}  // namespace
}  // namespace amaq
