#include "common/model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/model/checkpoint.h"
#include "common/model/compute_dtype.h"
#include "common/model/frozen_weight.h"
#include "common/model/int8_weight.h"
#include "common/model/nf4_rows.h"
#include "common/model/nf4_weight.h"
#include "common/base/error.h"
#include "model_test_util.h"

namespace amaq {
namespace {

using testing::TinyConfig;

// Random token ids and a mask whose second row is right-padded.
std::pair<torch::Tensor, torch::Tensor> Batch(const ModelConfig& c, int64_t b = 2, int64_t t = 7) {
  const torch::Tensor ids = torch::randint(c.vocab_size, {b, t}, torch::kLong);
  torch::Tensor mask = torch::ones({b, t}, torch::kLong);
  mask[1].slice(0, t - 3).fill_(0);
  return {ids, mask};
}

void RandomizeLora(ModelPart& part) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : part->LoraParameters()) t.normal_(0, 0.1);
}

struct SplitModels {
  ModelPart whole{nullptr}, client{nullptr}, server{nullptr};
};

// A whole model and its client/server halves with identical base and LoRA weights, through a
// checkpoint directory in the Hugging Face layout, all three holding their base as `format`.
SplitModels MakeSplit(const ModelConfig& c, int64_t cut, const std::string& dir,
                      BaseWeights format = BaseWeights::kFp32) {
  SplitModels m;
  m.whole = ModelPart(c, PartSpec::Whole(c));
  SaveModel(m.whole, dir);
  if (format != BaseWeights::kFp32) {
    m.whole = ModelPart(c, PartSpec::Whole(c), format);
    LoadPartWeights(m.whole, dir);
  }
  m.client = ModelPart(c, PartSpec::Client(cut), format);
  m.server = ModelPart(c, PartSpec::Server(c, cut), format);
  LoadPartWeights(m.client, dir);
  LoadPartWeights(m.server, dir);
  LoraConfig lora;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  for (ModelPart* p : {&m.whole, &m.client, &m.server}) (*p)->AddLora(lora);
  RandomizeLora(m.whole);
  // Copy the whole model's LoRA weights into the halves by name.
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, t] : m.whole->LoraParameters()) by_name[name] = t;
  torch::NoGradGuard no_grad;
  for (ModelPart* p : {&m.client, &m.server}) {
    for (auto& [name, t] : (*p)->LoraParameters()) t.copy_(by_name.at(name));
  }
  return m;
}

TEST(Model, SplitEqualsWholeForwardAndBackward) {
  torch::manual_seed(0);
  const ModelConfig c = TinyConfig();
  const std::string dir = testing::TempDir("split");
  for (int64_t cut : {0, 1, 2, 4}) {
    SplitModels m = MakeSplit(c, cut, dir);
    auto [ids, mask] = Batch(c);
    torch::Tensor labels = ids.masked_fill(mask == 0, -100);

    const torch::Tensor whole_logits = m.whole(ids, mask);
    NextTokenLoss(AtLabels(whole_logits, labels), labels).backward();

    // The split-learning step: the client's output crosses the cut, the server's gradient comes back.
    const torch::Tensor cut_activation = m.client(ids, mask);
    const torch::Tensor received = cut_activation.detach().requires_grad_(true);
    const torch::Tensor split_logits = m.server(received, mask);
    NextTokenLoss(AtLabels(split_logits, labels), labels).backward();
    if (cut_activation.requires_grad()) cut_activation.backward(received.grad());  // cut 0: nothing to train

    EXPECT_TRUE(torch::allclose(whole_logits, split_logits, 1e-6, 1e-6)) << "cut " << cut;
    std::map<std::string, torch::Tensor> grads;
    for (auto& [name, t] : m.whole->LoraParameters()) grads[name] = t.grad();
    int compared = 0;
    for (ModelPart* p : {&m.client, &m.server}) {
      for (auto& [name, t] : (*p)->LoraParameters()) {
        ASSERT_TRUE(t.grad().defined()) << name;
        EXPECT_TRUE(torch::allclose(t.grad(), grads.at(name), 1e-5, 1e-6)) << name << " cut " << cut;
        ++compared;
      }
    }
    EXPECT_EQ(compared, static_cast<int>(grads.size()));
  }
}

// The head run at the labelled positions only gives the loss of every position's logits with the
// unlabelled ones ignored, and the same gradients: those of the LoRA and of the part's input.
TEST(Model, TheHeadAtTheLabelsGivesTheLossOfEveryPosition) {
  torch::manual_seed(7);
  const ModelConfig c = TinyConfig();
  SplitModels m = MakeSplit(c, 2, testing::TempDir("labelled"));
  auto [ids, mask] = Batch(c, 3, 9);
  torch::Tensor labels = ids.masked_fill(mask == 0, -100);
  labels.slice(1, 0, 4).fill_(-100);  // a prompt of 4 tokens, and padding, carry no label
  labels[2].fill_(-100);              // a row with no label at all
  const torch::Tensor hidden = torch::randn({3, 9, c.hidden_size});
  const auto run = [&](bool at_labels) {
    for (auto& p : m.server->TrainableParameters()) p.mutable_grad().reset();
    const torch::Tensor x = hidden.clone().requires_grad_(true);
    torch::Tensor loss;
    if (at_labels) {
      loss = NextTokenLoss(m.server->LogitsAtLabels(x, mask, labels), labels);
    } else {  // the definition: every position's logits, the unlabelled ones ignored
      const torch::Tensor logits = m.server(x, mask);
      loss = torch::nn::functional::cross_entropy(
          logits.slice(1, 0, -1).reshape({-1, c.vocab_size}), labels.slice(1, 1).reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    }
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach(), x.grad()};
    for (auto& p : m.server->TrainableParameters()) out.push_back(p.grad().clone());
    return out;
  };
  const std::vector<torch::Tensor> want = run(false), got = run(true);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_GT(want[1].abs().sum().item<double>(), 0);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(torch::allclose(got[k], want[k], 1e-5, 1e-7)) << "tensor " << k;
  EXPECT_EQ(m.server->LogitsAtLabels(hidden, mask, labels).size(0), labels.slice(1, 1).ne(-100).sum().item<int64_t>());
  const torch::Tensor none = torch::full_like(labels, -100);
  EXPECT_TRUE(std::isnan(NextTokenLoss(m.server->LogitsAtLabels(hidden, mask, none), none).item<float>()))
      << "no label: no loss (a server refuses such a step)";
}

TEST(Model, UShapedSplitKeepsTheHeadOnTheClient) {
  torch::manual_seed(1);
  const ModelConfig c = TinyConfig();
  const std::string dir = testing::TempDir("ushape");
  ModelPart whole(c, PartSpec::Whole(c));
  SaveModel(whole, dir);
  ModelPart client(c, PartSpec::Client(1)), middle(c, PartSpec::ServerMiddle(c, 1)), head(c, PartSpec::ClientHead(c));
  for (ModelPart* p : {&client, &middle, &head}) LoadPartWeights(*p, dir);
  EXPECT_TRUE(head->layers.empty());
  auto [ids, mask] = Batch(c);
  const torch::Tensor expected = whole(ids, mask);
  EXPECT_TRUE(torch::allclose(head(middle(client(ids, mask), mask), mask), expected, 1e-6, 1e-6));
}

TEST(Model, PartsHoldOnlyTheirLayers) {
  const ModelConfig c = TinyConfig();
  ModelPart client(c, PartSpec::Client(1));
  ModelPart server(c, PartSpec::Server(c, 1));
  EXPECT_EQ(client->layers.size(), 1u);
  EXPECT_EQ(server->layers.size(), 3u);
  for (auto& [name, t] : client->HfParameters()) {
    EXPECT_TRUE(name.rfind("model.layers.0.", 0) == 0 || name == "model.embed_tokens.weight") << name;
  }
  EXPECT_THROW(ModelPart(c, PartSpec::Client(5)), Error);
}

TEST(Model, LeftAndRightPaddingMatchUnpadded) {
  torch::manual_seed(2);
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c));
  const torch::Tensor ids = torch::randint(c.vocab_size, {1, 5}, torch::kLong);
  const torch::Tensor alone = model(ids, torch::ones({1, 5}, torch::kLong));
  const torch::Tensor pad = torch::zeros({1, 3}, torch::kLong);
  const torch::Tensor right = model(torch::cat({ids, pad}, 1), torch::cat({torch::ones({1, 5}, torch::kLong), pad}, 1));
  const torch::Tensor left = model(torch::cat({pad, ids}, 1), torch::cat({pad, torch::ones({1, 5}, torch::kLong)}, 1));
  EXPECT_TRUE(torch::allclose(right.slice(1, 0, 5), alone, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(left.slice(1, 3), alone, 1e-5, 1e-5));
  EXPECT_FALSE(torch::isnan(left).any().item<bool>());
}

TEST(Model, Bf16RunsCloseToFp32) {
  torch::manual_seed(3);
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c));
  auto [ids, mask] = Batch(c);
  const torch::Tensor fp32 = model(ids, mask);
  model->to(torch::kBFloat16);
  const torch::Tensor bf16 = model(ids, mask);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  EXPECT_LT((bf16.to(torch::kFloat) - fp32).abs().max().item<float>(), 0.05f);
}

TEST(Lora, ZeroBLeavesTheBaseModelAndOnlyLoraTrains) {
  torch::manual_seed(4);
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c));
  auto [ids, mask] = Batch(c);
  const torch::Tensor base = model(ids, mask).detach();
  LoraConfig lora;
  lora.rank = 4;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  model->AddLora(lora);
  const torch::Tensor with_adapter = model(ids, mask);
  EXPECT_TRUE(torch::equal(with_adapter, base));
  NextTokenLoss(AtLabels(with_adapter, ids), ids).backward();
  for (const auto& p : model->named_parameters()) {
    const bool is_lora = p.key().find("lora_") != std::string::npos;
    EXPECT_EQ(p.value().grad().defined(), is_lora) << p.key();
  }
  // 4 layers x 4 attention projections x (A, B)
  EXPECT_EQ(model->TrainableParameters().size(), 32u);
  EXPECT_EQ(model->LoraParameters().size(), 32u);
}

TEST(Lora, MergeGivesTheSameOutputs) {
  torch::manual_seed(5);
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c));
  LoraConfig lora;
  lora.target_modules = {"v_proj", "down_proj"};
  model->AddLora(lora);
  RandomizeLora(model);
  auto [ids, mask] = Batch(c);
  const torch::Tensor before = model(ids, mask).detach();
  model->MergeLora();
  EXPECT_TRUE(model->LoraParameters().empty());
  EXPECT_TRUE(torch::allclose(model(ids, mask), before, 1e-5, 1e-5));
}

TEST(Lora, BadConfigIsRefused) {
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c));
  LoraConfig lora;
  lora.target_modules = {"qkv"};
  EXPECT_THROW(model->AddLora(lora), Error);
  lora = LoraConfig{};
  lora.rank = 0;
  EXPECT_THROW(model->AddLora(lora), Error);
}

TEST(Nf4Weight, DequantizesToTheCodecsValues) {
  torch::manual_seed(6);
  const torch::Tensor w = torch::randn({48, 32}) * 0.02;
  const Nf4Weight nf4 = Nf4Weight::Quantize(w);
  const quant::Nf4Weights codec = quant::Nf4Weights::Quantize(w.data_ptr<float>(), w.numel());
  torch::Tensor want = torch::empty({48, 32});
  codec.Dequantize(want.data_ptr<float>());
  EXPECT_TRUE(torch::equal(nf4.Dense(torch::kFloat), want));
  EXPECT_TRUE(torch::equal(nf4.Dense(torch::kBFloat16), want.to(torch::kBFloat16)));
  EXPECT_GT((nf4.Dense(torch::kFloat) - w).abs().max().item<float>(), 0.0f);  // it is lossy
}

// The one-pass rebuild (nf4_rows.h) against the table lookup's tensor operations, on LibTorch's
// two threads: rows that begin and end inside blocks, a part of the weight larger than a
// thread's share, fp32 and bf16.
TEST(Nf4Weight, OnePassRowsAreTheTensorOperationsRows) {
  torch::manual_seed(9);
  const Nf4Weight nf4 = Nf4Weight::Quantize(torch::randn({704, 120}) * 0.02);  // rows of 120: blocks straddle rows
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 704}, {3, 1}, {5, 611}, {703, 1}}) {
      EXPECT_TRUE(torch::equal(nf4.DenseRows(first, count, dtype), nf4.DenseRowsByTensorOps(first, count, dtype)))
          << first << "+" << count << " " << dtype;
    }
  }
  torch::set_num_threads(threads);
}

// The AVX-512 pass against the portable one, bit for bit, on random codes and scales: blocks of
// 64 (whole blocks 32 weights at a time), of 48 (one weight at a time), ranges cut inside blocks.
TEST(Nf4Rows, Avx512PassIsThePortablePass) {
  if (!Nf4HasAvx512()) GTEST_SKIP() << "this CPU has no AVX-512F, so its pass cannot run here (the portable pass is the one used)";
  torch::manual_seed(10);
  const int64_t n = 64 * 48 * 40;
  const torch::Tensor codes = torch::randint(0, 256, {n / 2}, torch::kUInt8);
  const torch::Tensor scale_codes = torch::randint(-127, 128, {n / 16}, torch::kInt8);
  const torch::Tensor steps = torch::rand({n / 16}) * 1e-3;
  for (const int64_t block : {64, 48}) {
    const Nf4View view{quant::Nf4Levels().data(), codes.data_ptr<uint8_t>(), scale_codes.data_ptr<int8_t>(),
                       steps.data_ptr<float>(), 0.05f, block, 3};
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {7, 1000}, {64, 96}, {n - 33, 33}}) {
      std::vector<float> portable(count), avx512(count);
      std::vector<uint16_t> portable_bf16(count), avx512_bf16(count);
      nf4_serial::Portable(view, first, count, portable.data());
      nf4_serial::Avx512(view, first, count, avx512.data());
      nf4_serial::Portable(view, first, count, portable_bf16.data());
      nf4_serial::Avx512(view, first, count, avx512_bf16.data());
      EXPECT_EQ(std::memcmp(portable.data(), avx512.data(), count * sizeof(float)), 0) << block << " " << first;
      EXPECT_EQ(portable_bf16, avx512_bf16) << block << " " << first;
      EXPECT_GT(*std::max_element(portable.begin(), portable.end()), 0.0f);  // not all zero: the pass wrote
    }
  }
}

TEST(Nf4Weight, ProductAndItsGradientAreThoseOfTheDequantizedWeight) {
  torch::manual_seed(7);
  const Nf4Weight nf4 = Nf4Weight::Quantize(torch::randn({48, 32}) * 0.02);
  const torch::Tensor x = torch::randn({3, 5, 32}, torch::requires_grad());
  const torch::Tensor x_dense = x.detach().clone().requires_grad_(true);
  const torch::Tensor upstream = torch::randn({3, 5, 48});
  const torch::Tensor y = nf4.Linear(x);
  const torch::Tensor y_dense = torch::nn::functional::linear(x_dense, nf4.Dense(torch::kFloat));
  (y * upstream).sum().backward();
  (y_dense * upstream).sum().backward();
  EXPECT_TRUE(torch::allclose(y, y_dense, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(x.grad(), x_dense.grad(), 1e-6, 1e-6));
}

TEST(Nf4Weight, ProductsInBlocksOfRowsAreTheDenseProduct) {
  torch::manual_seed(8);
  const Nf4Weight nf4 = Nf4Weight::Quantize(torch::randn({48, 40}) * 0.02);  // rows cut blocks of 64 apart
  const torch::Tensor dense = nf4.Dense(torch::kFloat);
  EXPECT_TRUE(torch::equal(nf4.DenseRows(3, 7, torch::kFloat), dense.narrow(0, 3, 7)));
  EXPECT_TRUE(torch::equal(nf4.DenseRows(47, 1, torch::kFloat), dense.narrow(0, 47, 1)));
  const torch::Tensor upstream = torch::randn({2, 5, 48});
  const torch::Tensor x_dense = torch::randn({2, 5, 40}, torch::requires_grad());
  (torch::nn::functional::linear(x_dense, dense) * upstream).sum().backward();
  for (int64_t rows : {1, 5, 47}) {  // uneven last blocks included
    const torch::Tensor x = x_dense.detach().clone().requires_grad_(true);
    const torch::Tensor y = nf4.Linear(x, rows);
    (y * upstream).sum().backward();
    EXPECT_TRUE(torch::allclose(y, torch::nn::functional::linear(x_dense, dense), 1e-6, 1e-6)) << rows;
    EXPECT_TRUE(torch::allclose(x.grad(), x_dense.grad(), 1e-6, 1e-6)) << rows;
  }
}

// int8: a code in [-127, 127] per weight and max |w| / 127 per row, written here from that
// definition; every weight within half a step of its row's grid, a row of zeros exact.
TEST(Int8Weight, DequantizesToThePerRowGridOfTheDefinition) {
  torch::manual_seed(14);
  torch::Tensor w = torch::randn({6, 40}) * 0.02;
  w[2].zero_();
  w[4][7] = 0.5;  // an outlier widens its row's step only
  const Int8Weight q = Int8Weight::Quantize(w);
  const torch::Tensor dense = q.Dense(torch::kFloat);
  for (int64_t r = 0; r < w.size(0); ++r) {
    const float step = w[r].abs().max().item<float>() / 127;
    for (int64_t i = 0; i < w.size(1); ++i) {
      const float x = w[r][i].item<float>();
      const float code = step > 0 ? std::nearbyint(x / step) : 0.0f;
      ASSERT_FLOAT_EQ(dense[r][i].item<float>(), code * step) << r << "," << i;
      ASSERT_LE(std::fabs(dense[r][i].item<float>() - x), step / 2 * (1 + 1e-5)) << r << "," << i;
    }
  }
  EXPECT_TRUE(torch::equal(dense[2], torch::zeros({40})));
  EXPECT_TRUE(torch::equal(q.DenseRows(3, 2, torch::kFloat), dense.narrow(0, 3, 2)));
  EXPECT_EQ(q.StoredBytes(), 6 * 40 + 6 * 4);
  const torch::Tensor x = torch::randn({3, 40});
  EXPECT_TRUE(torch::allclose(q.Linear(x, 4), torch::nn::functional::linear(x, dense), 1e-6, 1e-6));
}

// The split-learning step of `m` against the whole model: logits and every LoRA gradient.
void ExpectSplitEqualsWhole(SplitModels& m, const ModelConfig& c) {
  auto [ids, mask] = Batch(c);
  const torch::Tensor labels = ids.masked_fill(mask == 0, -100);
  const torch::Tensor whole_logits = m.whole(ids, mask);
  NextTokenLoss(AtLabels(whole_logits, labels), labels).backward();
  const torch::Tensor cut = m.client(ids, mask);
  const torch::Tensor received = cut.detach().requires_grad_(true);
  const torch::Tensor split_logits = m.server(received, mask);
  NextTokenLoss(AtLabels(split_logits, labels), labels).backward();
  cut.backward(received.grad());
  EXPECT_TRUE(torch::allclose(whole_logits, split_logits, 1e-6, 1e-6));
  std::map<std::string, torch::Tensor> grads;
  for (auto& [name, t] : m.whole->LoraParameters()) grads[name] = t.grad();
  for (ModelPart* p : {&m.client, &m.server}) {
    for (auto& [name, t] : (*p)->LoraParameters()) {
      ASSERT_TRUE(t.grad().defined()) << name;
      EXPECT_TRUE(torch::allclose(t.grad(), grads.at(name), 1e-5, 1e-6)) << name;
    }
  }
}

TEST(CompactBase, LoadingStoresEachCheckpointTensorInThePartsFormat) {
  torch::manual_seed(8);
  ModelConfig c = TinyConfig();
  const std::string dir = testing::TempDir("compact-load");
  ModelPart dense(c, PartSpec::Whole(c));
  SaveModel(dense, dir);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [name, t] : dense->HfParameters()) saved[name] = t.detach().clone();
  for (BaseWeights format : {BaseWeights::kBf16, BaseWeights::kNf4, BaseWeights::kInt8}) {
    ModelPart part(c, PartSpec::Whole(c), format);
    LoadPartWeights(part, dir);
    const LoraLinear& q = part->layers[1]->self_attn->q_proj;
    EXPECT_EQ(q->format(), format);
    EXPECT_FALSE(q->weight.defined());  // no dense copy is held
    const torch::Tensor w = saved.at("model.layers.1.self_attn.q_proj.weight");
    const torch::Tensor want = format == BaseWeights::kNf4    ? Nf4Weight::Quantize(w).Dense(torch::kFloat)
                               : format == BaseWeights::kInt8 ? Int8Weight::Quantize(w).Dense(torch::kFloat)
                                                              : w.to(torch::kBFloat16).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(q->DenseWeight(torch::kFloat), want)) << ToString(format);
    // Embedding and head (tied in TinyConfig or not) are bf16 in every compact format; norms stay.
    ASSERT_TRUE(part->embed_frozen && part->head_frozen);
    EXPECT_TRUE(torch::equal(part->embed_frozen->Dense(torch::kFloat),
                             saved.at("model.embed_tokens.weight").to(torch::kBFloat16).to(torch::kFloat)));
    EXPECT_TRUE(torch::equal(part->norm->weight, saved.at("model.norm.weight")));
    // Every base tensor round-trips through HfParameters under its checkpoint name.
    for (auto& [name, t] : part->HfParameters()) EXPECT_EQ(t.sizes(), saved.at(name).sizes()) << name;
  }
}

TEST(CompactBase, SplitEqualsWholeAndTheBytesShrink) {
  const ModelConfig c = TinyConfig();
  int64_t fp32_bytes = 0;
  {
    ModelPart part(c, PartSpec::Client(2));
    fp32_bytes = part->BaseWeightBytes();
  }
  for (BaseWeights format : {BaseWeights::kBf16, BaseWeights::kNf4, BaseWeights::kInt8}) {
    torch::manual_seed(9);
    SplitModels m = MakeSplit(c, 2, testing::TempDir("compact-split"), format);
    ExpectSplitEqualsWhole(m, c);
    int64_t projections_fp32 = 0, projections = 0, int8_bytes = 0;
    for (auto& layer : m.client->layers) {
      for (auto& [path, linear] : layer->Projections()) {
        projections_fp32 += linear->out_features() * linear->in_features() * 4;
        projections += linear->BaseWeightBytes();
        int8_bytes += linear->out_features() * (linear->in_features() + 4);  // a byte a weight, a float a row
      }
    }
    const double ratio = static_cast<double>(projections) / static_cast<double>(projections_fp32);
    if (format == BaseWeights::kNf4) {
      EXPECT_NEAR(ratio, 4.13 / 32, 0.01);
    } else if (format == BaseWeights::kInt8) {
      EXPECT_EQ(projections, int8_bytes);
    } else {
      EXPECT_DOUBLE_EQ(ratio, 0.5);
    }
    EXPECT_LT(m.client->BaseWeightBytes(), fp32_bytes * (format == BaseWeights::kNf4 ? 0.3 : 0.55)) << ToString(format);
  }
}

TEST(CompactBase, CastsMovesAndMergesKeepTheOutputs) {
  torch::manual_seed(10);
  const ModelConfig c = TinyConfig();
  ModelPart model(c, PartSpec::Whole(c), BaseWeights::kNf4);
  model->AddLora(LoraConfig{});
  RandomizeLora(model);
  auto [ids, mask] = Batch(c);
  const torch::Tensor fp32 = model(ids, mask).detach();
  model->to(torch::kBFloat16);
  EXPECT_EQ(model->compute_dtype(), torch::kBFloat16);
  EXPECT_LT((model(ids, mask).to(torch::kFloat) - fp32).abs().max().item<float>(), 0.05f);
  model->to(torch::kFloat);
  model->to(torch::Device(torch::kCPU));
  EXPECT_EQ(model->layers[0]->mlp->down_proj->format(), BaseWeights::kNf4);
  const torch::Tensor unmerged = model(ids, mask).detach();  // after the bf16 round trip of the rest
  model->MergeLora();
  EXPECT_EQ(model->layers[0]->mlp->down_proj->format(), BaseWeights::kFp32);  // merged: dense again
  EXPECT_TRUE(torch::allclose(model(ids, mask), unmerged, 1e-4, 1e-5));
}

TEST(CompactBase, BadShapesAndFormatsAreRefused) {
  const ModelConfig c = TinyConfig();
  ModelPart part(c, PartSpec::Client(1), BaseWeights::kNf4);
  EXPECT_THROW(part->layers[0]->self_attn->q_proj->SetBaseWeight(torch::zeros({3, 5})), Error);
  EXPECT_THROW(ParseBaseWeights("int4"), Error);
  EXPECT_EQ(ParseBaseWeights(ToString(BaseWeights::kNf4)), BaseWeights::kNf4);
  EXPECT_THROW(FrozenWeight::Store(torch::zeros({4, 64}), BaseWeights::kFp32), Error);
  torch::Tensor nan = torch::zeros({4, 64});
  nan[2][3] = std::nanf("");
  EXPECT_THROW(FrozenWeight::Store(nan, BaseWeights::kNf4), Error);
  EXPECT_THROW(FrozenWeight::Store(nan, BaseWeights::kInt8), Error);
  EXPECT_EQ(ParseBaseWeights(ToString(BaseWeights::kInt8)), BaseWeights::kInt8);
  EXPECT_THROW(FrozenWeight::Store(torch::zeros({3, 7}), BaseWeights::kNf4), Error);  // 21 weights: no 64-blocks
}

TEST(Recompute, GradientsEqualTheStoredActivationPath) {
  const ModelConfig c = TinyConfig();
  for (BaseWeights format : {BaseWeights::kFp32, BaseWeights::kNf4}) {
    torch::manual_seed(11);
    const std::string dir = testing::TempDir("recompute");
    SplitModels stored = MakeSplit(c, 3, dir, format);
    torch::manual_seed(11);
    SplitModels recomputed = MakeSplit(c, 3, dir, format);
    recomputed.client->set_recompute_layers(true);
    auto [ids, mask] = Batch(c);
    const torch::Tensor upstream = torch::randn({ids.size(0), ids.size(1), c.hidden_size});
    const torch::Tensor out_stored = stored.client(ids, mask);
    const torch::Tensor out_recomputed = recomputed.client(ids, mask);
    EXPECT_TRUE(torch::equal(out_stored, out_recomputed));
    out_stored.backward(upstream);
    out_recomputed.backward(upstream);
    std::map<std::string, torch::Tensor> grads;
    for (auto& [name, t] : stored.client->LoraParameters()) grads[name] = t.grad();
    ASSERT_EQ(grads.size(), 3u * 7 * 2);
    for (auto& [name, t] : recomputed.client->LoraParameters()) {
      ASSERT_TRUE(t.grad().defined()) << name;
      EXPECT_TRUE(torch::allclose(t.grad(), grads.at(name), 1e-6, 1e-7)) << name << " " << ToString(format);
    }
    torch::NoGradGuard no_grad;  // evaluation: nothing to recompute, same values
    EXPECT_TRUE(torch::equal(recomputed.client(ids, mask), out_stored.detach()));
  }
}

// RMSNorm keeps only x and 1/rms(x) for backward; its gradients are those of the plain formula.
TEST(RMSNorm, GradientsAreThoseOfThePlainFormula) {
  torch::manual_seed(13);
  RMSNorm norm(24, 1e-5);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  const torch::Tensor x = (torch::randn({3, 5, 24}) * 2).requires_grad_(true);
  const torch::Tensor x_plain = x.detach().clone().requires_grad_(true);
  const torch::Tensor w_plain = norm->weight.detach().clone().requires_grad_(true);
  const torch::Tensor upstream = torch::randn({3, 5, 24});
  const torch::Tensor y = norm(x);
  const torch::Tensor y_plain = w_plain * x_plain * torch::rsqrt(x_plain.pow(2).mean(-1, true) + 1e-5);
  EXPECT_TRUE(torch::allclose(y, y_plain, 1e-6, 1e-6));
  (y * upstream).sum().backward();
  (y_plain * upstream).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x_plain.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(norm->weight.grad(), w_plain.grad(), 1e-5, 1e-6));
}

// bf16 compute (QLoRA's recipe with an nf4 base) keeps the LoRA parameters and their gradients
// fp32, computes the activations in bf16, and follows the fp32 computation within bf16's rounding.
TEST(ComputeDtype, Bf16ActivationsFollowFp32WithFp32Parameters) {
  const ModelConfig c = TinyConfig();
  for (BaseWeights format : {BaseWeights::kFp32, BaseWeights::kNf4}) {
    torch::manual_seed(12);
    const std::string dir = testing::TempDir("compute-dtype");
    SplitModels fp32 = MakeSplit(c, 2, dir, format);
    torch::manual_seed(12);
    SplitModels bf16 = MakeSplit(c, 2, dir, format);
    bf16.whole->set_compute_dtype(ParseComputeDtype("bf16", torch::kCPU));
    auto [ids, mask] = Batch(c);
    const torch::Tensor labels = ids.masked_fill(mask == 0, -100);
    const torch::Tensor want = fp32.whole(ids, mask);
    const torch::Tensor got = bf16.whole(ids, mask);
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    const double error = ((got.to(torch::kFloat) - want).norm() / want.norm()).item<double>();
    EXPECT_GT(error, 0.0) << "bf16 compute rounds";
    EXPECT_LT(error, 0.03) << ToString(format);
    NextTokenLoss(AtLabels(want, labels), labels).backward();
    NextTokenLoss(AtLabels(got, labels), labels).backward();
    std::map<std::string, torch::Tensor> grads;
    for (auto& [name, t] : fp32.whole->LoraParameters()) grads[name] = t.grad();
    for (auto& [name, t] : bf16.whole->LoraParameters()) {
      ASSERT_EQ(t.scalar_type(), torch::kFloat) << name;
      ASSERT_TRUE(t.grad().defined()) << name;
      ASSERT_EQ(t.grad().scalar_type(), torch::kFloat) << name;
      const torch::Tensor& g = grads.at(name);
      EXPECT_GT(torch::cosine_similarity(t.grad().flatten(), g.flatten(), 0).item<double>(), 0.98)
          << name << " " << ToString(format);
    }
  }
  ModelPart part(c, PartSpec::Client(1));
  EXPECT_THROW(part->set_compute_dtype(torch::kInt), Error);
  EXPECT_EQ(part->compute_dtype(), torch::kFloat);
}

// auto is bf16 exactly where the device has bf16 arithmetic: on the CPU, where the kernel's
// /proc/cpuinfo lists AVX512_BF16 or AMX-BF16 (the program asks the CPU itself, by cpuid).
TEST(ComputeDtype, AutoIsBf16WhereTheDeviceComputesItNatively) {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line) && flags.empty()) {
    if (line.rfind("flags", 0) == 0) flags = line + " ";
  }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const bool native = flags.find(" avx512_bf16 ") != std::string::npos || flags.find(" amx_bf16 ") != std::string::npos;
#else
  const bool native = false;  // auto stays fp32 on other CPUs
#endif
  EXPECT_EQ(ComputesBf16Natively(torch::kCPU), native);
  EXPECT_EQ(ParseComputeDtype("auto", torch::kCPU), native ? torch::kBFloat16 : torch::kFloat);
  EXPECT_EQ(ParseComputeDtype("auto", torch::Device(torch::kCUDA, 0)), torch::kBFloat16);
  for (const torch::Device device : {torch::Device(torch::kCPU), torch::Device(torch::kCUDA, 0)}) {
    EXPECT_EQ(ParseComputeDtype("fp32", device), torch::kFloat);
    EXPECT_EQ(ParseComputeDtype("bf16", device), torch::kBFloat16);
  }
  EXPECT_EQ(ComputeDtypeName(torch::kFloat), "fp32");
  EXPECT_EQ(ComputeDtypeName(torch::kBFloat16), "bf16");
  EXPECT_THROW(ComputeDtypeName(torch::kHalf), Error);
  EXPECT_THROW(ParseComputeDtype("fp16", torch::kCPU), Error);
}

TEST(Recompute, LoraDropoutIsRefused) {
  const ModelConfig c = TinyConfig();
  ModelPart part(c, PartSpec::Client(2));
  LoraConfig lora;
  lora.dropout = 0.1;
  part->AddLora(lora);
  EXPECT_THROW(part->set_recompute_layers(true), Error);
}

}  // namespace
}  // namespace amaq
