// The whole fine-tune as one PEFT adapter: what a split run exports (adapter_out, merged_out)
// computes, in one unsplit model, what the split model that trained it computes.
#include <gtest/gtest.h>

#include <filesystem>

#include "client/adapter_export.h"
#include "inproc/local_transport.h"
#include "client/split_client.h"
#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "server/split_server.h"
#include "tiny_model.h"

namespace amaq {
namespace {

// Random token ids [2, 9], the second row right-padded by 3.
std::pair<torch::Tensor, torch::Tensor> Tokens(const ModelConfig& c) {
  torch::manual_seed(17);
  const torch::Tensor ids = torch::randint(c.vocab_size, {2, 9}, torch::kLong);
  torch::Tensor mask = torch::ones({2, 9}, torch::kLong);
  mask[1].slice(0, 6).fill_(0);
  return {ids, mask};
}

// A part of `spec` with the base of `dir` and LoRA values taken by name from `values`.
ModelPart PartWith(const ModelConfig& c, PartSpec spec, const std::string& dir, const LoraConfig& lora,
                   const NamedFloats& values) {
  ModelPart part(c, spec);
  LoadPartWeights(part, dir);
  part->AddLora(lora);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : part->LoraParameters()) {
    const NamedFloat& v = values.at(name);
    tensor.copy_(torch::tensor(v.values, torch::kFloat).reshape(v.shape));
  }
  return part;
}

torch::Tensor Logits(ModelPart& whole, const torch::Tensor& ids, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  whole->eval();
  return whole(ids, mask) * mask.unsqueeze(-1);  // padding positions compute nothing anyone reads
}

class WholeAdapter : public ::testing::TestWithParam<int64_t> {
 protected:
  static void SetUpTestSuite() { dir_ = new std::string(testing::TinyModelDir("whole-adapter")); }
  static void TearDownTestSuite() { delete dir_; }
  static std::string* dir_;
};
std::string* WholeAdapter::dir_ = nullptr;

// After a short split run at cut 0, 2 and L, the exported adapter loaded on the whole base, and the
// merged directory alone, give the logits of client part -> server part with the trained LoRA.
TEST_P(WholeAdapter, TheExportedAdapterComputesWhatTheSplitModelComputes) {
  const int64_t cut = GetParam();
  const ModelConfig c = ModelConfig::Load(*dir_ + "/config.json");
  server::ServerOptions so = testing::TinyServerOptions(*dir_);
  so.cut_layer = cut;
  server::SplitServer server(so);
  inproc::LocalTransport transport(server);
  client::ClientOptions co = testing::TinyClientOptions(*dir_, "client-0", "fp32", 6);
  co.cut_layer = cut;
  co.adapter_out = testing::TempDir("adapter-" + std::to_string(cut));
  co.merged_out = testing::TempDir("merged-" + std::to_string(cut));
  client::SplitClient client(co, testing::ParityDataset(32), transport);
  client.Run();

  // The split model that trained: the client's LoRA and the server's, as each side holds them.
  const LoraConfig lora = testing::AllTargets();
  ModelPart client_part = PartWith(c, PartSpec::Client(cut), *dir_, lora, client.Adapter());
  ModelPart server_part = PartWith(c, PartSpec::Server(c, cut), *dir_, lora, server.AdapterOf("client-0").tensors);
  const auto [ids, mask] = Tokens(c);
  torch::Tensor split;
  {
    torch::NoGradGuard no_grad;
    client_part->eval();
    server_part->eval();
    split = server_part(client_part(ids, mask), mask) * mask.unsqueeze(-1);
  }

  ModelPart whole(c, PartSpec::Whole(c));
  LoadPartWeights(whole, *dir_);
  const torch::Tensor base = Logits(whole, ids, mask);
  whole->AddLora(ReadPeftAdapterConfig(co.adapter_out));
  EXPECT_EQ(LoadPeftAdapter(whole, co.adapter_out), static_cast<int>(whole->LoraParameters().size()));
  const torch::Tensor adapted = Logits(whole, ids, mask);
  EXPECT_TRUE(torch::allclose(adapted, split, 1e-5, 1e-5)) << "max difference " << (adapted - split).abs().max().item<float>();
  EXPECT_GT((adapted - base).abs().max().item<float>(), 1e-3) << "training moved the adapter";

  ModelPart merged(c, PartSpec::Whole(c));
  LoadPartWeights(merged, co.merged_out);
  EXPECT_TRUE(torch::allclose(Logits(merged, ids, mask), split, 1e-5, 1e-5));
  EXPECT_TRUE(std::filesystem::exists(co.merged_out + "/tokenizer.model"));
}

INSTANTIATE_TEST_SUITE_P(Cuts, WholeAdapter, ::testing::Values(0, 2, 4));

// With shared_lora the server's half is the LoRA common to every client, and says so.
TEST_F(WholeAdapter, ASharedServerLoraIsMarkedShared) {
  server::ServerOptions so = testing::TinyServerOptions(*dir_);
  so.shared_lora = true;
  server::SplitServer server(so);
  server.Join("a", ModelFingerprint(*dir_, 2), 2, "fp32");
  server.Join("b", ModelFingerprint(*dir_, 2), 2, "fp32");
  const ServerAdapterInfo a = server.AdapterOf("a"), b = server.AdapterOf("b");
  EXPECT_TRUE(a.shared);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_EQ(t.values, b.tensors.at(name).values) << name;
  EXPECT_THROW(server.AdapterOf("stranger"), Error);
}

// A server whose LoRA settings differ from the client's cannot be stated in one adapter_config:
// the export refuses and writes nothing.
TEST_F(WholeAdapter, DifferentLoraSettingsOnTheTwoSidesAreRefused) {
  const ModelConfig c = ModelConfig::Load(*dir_ + "/config.json");
  server::ServerOptions so = testing::TinyServerOptions(*dir_);
  so.lora.rank = 4;
  server::SplitServer server(so);
  server.Join("client-0", ModelFingerprint(*dir_, 2), 2, "fp32");
  ModelPart client_part(c, PartSpec::Client(2));
  client_part->AddLora(testing::AllTargets());
  const std::string out = testing::TempDir("refused-adapter") + "/adapter";
  try {
    client::ExportWholeAdapter(client_part, server.AdapterOf("client-0"), testing::AllTargets(), *dir_, out, "");
    FAIL() << "a rank-4 server and a rank-8 client made one adapter";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("lora_"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A server's tensors that are not the LoRA of layers [cut, L) in the agreed shapes are refused
// (a missing one, one of another shape, one of the client's layers), and nothing is written.
TEST_F(WholeAdapter, ServerTensorsOfAnotherShapeOrLayerAreRefused) {
  const ModelConfig c = ModelConfig::Load(*dir_ + "/config.json");
  for (const int cut : {2, 0}) {  // a client with layers, and one without (its shapes from a one-layer part)
    ModelPart client_part(c, PartSpec::Client(cut));
    client_part->AddLora(testing::AllTargets());
    server::ServerOptions so = testing::TinyServerOptions(*dir_);
    so.cut_layer = cut;
    server::SplitServer at_cut(so);
    at_cut.Join("client-0", ModelFingerprint(*dir_, cut), cut, "fp32");
    const ServerAdapterInfo good = at_cut.AdapterOf("client-0");
    const std::string out = testing::TempDir("tampered-adapter") + "/adapter";
    client::ExportWholeAdapter(client_part, good, testing::AllTargets(), *dir_, out, "");  // accepted as it is
    ServerAdapterInfo missing = good, reshaped = good, elsewhere = good;
    missing.tensors.erase(missing.tensors.begin());
    NamedFloat& first = reshaped.tensors.begin()->second;
    first.shape = {static_cast<int64_t>(first.values.size())};
    elsewhere.tensors.erase(elsewhere.tensors.begin());
    elsewhere.tensors["model.layers.0.self_attn.q_proj.lora_A.weight"] = good.tensors.begin()->second;
    if (cut == 0) elsewhere.tensors["model.layers.9.self_attn.q_proj.lora_A.weight"] = good.tensors.begin()->second;
    for (const ServerAdapterInfo* bad : {&missing, &reshaped, &elsewhere}) {
      const std::string refused = testing::TempDir("refused-tampered") + "/adapter";
      try {
        client::ExportWholeAdapter(client_part, *bad, testing::AllTargets(), *dir_, refused, "");
        ADD_FAILURE() << "a tampered server adapter was written (cut " << cut << ")";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
      }
      EXPECT_FALSE(std::filesystem::exists(refused));
    }
  }
}

// The U-shaped split (the client keeps the head): its three parts' LoRA as one adapter gives the
// whole model the logits of client -> server middle -> client head.
TEST_F(WholeAdapter, AUShapedSplitsPartsMakeOneAdapter) {
  const ModelConfig c = ModelConfig::Load(*dir_ + "/config.json");
  const LoraConfig lora = testing::AllTargets();
  ModelPart client_part(c, PartSpec::Client(1)), middle(c, PartSpec::ServerMiddle(c, 1)), head(c, PartSpec::ClientHead(c));
  for (ModelPart* p : {&client_part, &middle, &head}) {
    LoadPartWeights(*p, *dir_);
    (*p)->AddLora(lora);
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : (*p)->LoraParameters()) t.normal_(0, 0.1);
  }
  const std::string adapter = testing::TempDir("u-shaped-adapter");
  SavePeftAdapter({&client_part, &middle, &head}, lora, *dir_, adapter);
  ModelPart whole(c, PartSpec::Whole(c));
  LoadPartWeights(whole, *dir_);
  whole->AddLora(ReadPeftAdapterConfig(adapter));
  EXPECT_EQ(LoadPeftAdapter(whole, adapter), static_cast<int>(whole->LoraParameters().size()));
  const auto [ids, mask] = Tokens(c);
  torch::NoGradGuard no_grad;
  const torch::Tensor split = head(middle(client_part(ids, mask), mask), mask) * mask.unsqueeze(-1);
  EXPECT_TRUE(torch::allclose(Logits(whole, ids, mask), split, 1e-5, 1e-5));
}

TEST(PeftAdapterConfig, MissingOrBrokenConfigsGiveClearErrors) {
  const std::string dir = testing::TempDir("bad-adapter-config");
  EXPECT_THROW(ReadPeftAdapterConfig(dir), Error);
  std::ofstream(dir + "/adapter_config.json") << R"({"peft_type": "LORA", "lora_alpha": 16})";
  try {
    ReadPeftAdapterConfig(dir);
    FAIL() << "a config without r loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  }
  std::ofstream(dir + "/adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": "q_proj"})";
  const LoraConfig lora = ReadPeftAdapterConfig(dir);
  EXPECT_EQ(lora.rank, 4);
  EXPECT_EQ(lora.target_modules, std::vector<std::string>{"q_proj"});
}

}  // namespace
}  // namespace amaq
