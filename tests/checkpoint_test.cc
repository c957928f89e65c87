#include "common/model/checkpoint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "common/base/error.h"
#include "model_test_util.h"

namespace amaq {
namespace {

using testing::TinyConfig;

torch::Tensor Ids(const ModelConfig& c) { return torch::randint(c.vocab_size, {2, 6}, torch::kLong); }
torch::Tensor Mask() { return torch::ones({2, 6}, torch::kLong); }

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Runs fn and returns the amaq::Error it must throw.
template <typename Fn>
Error Expect(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an amaq::Error";
  return Error(ErrorCode::kInternal, "");
}

bool Mentions(const Error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

TEST(Checkpoint, SavedModelLoadsWithTheSameLogits) {
  torch::manual_seed(0);
  for (bool tied : {false, true}) {
    ModelConfig c = TinyConfig();
    c.tie_word_embeddings = tied;
    const std::string dir = testing::TempDir(tied ? "tied" : "untied");
    ModelPart writer(c, PartSpec::Whole(c));
    SaveModel(writer, dir);
    const ModelConfig read = ModelConfig::Load(dir + "/config.json");
    EXPECT_EQ(read.ToJson(), c.ToJson());
    ModelPart reader(read, PartSpec::Whole(read));
    LoadPartWeights(reader, dir);
    const torch::Tensor ids = Ids(c);
    EXPECT_TRUE(torch::equal(reader(ids, Mask()), writer(ids, Mask()))) << "tied " << tied;
    const SafetensorsFile file = SafetensorsFile::Open(dir + "/model.safetensors");
    EXPECT_EQ(file.Has("lm_head.weight"), !tied);
    EXPECT_TRUE(file.Has("model.layers.3.self_attn.q_proj.bias"));
    EXPECT_TRUE(file.Has("model.layers.0.post_attention_layernorm.weight"));
  }
}

TEST(Checkpoint, Bf16AndF16CheckpointsLoad) {
  torch::manual_seed(1);
  const ModelConfig c = TinyConfig();
  ModelPart writer(c, PartSpec::Whole(c));
  const torch::Tensor ids = Ids(c);
  const torch::Tensor expected = writer(ids, Mask());
  for (torch::Dtype dtype : {torch::kBFloat16, torch::kHalf}) {
    const std::string dir = testing::TempDir("half");
    SaveModel(writer, dir, dtype);
    ModelPart reader(c, PartSpec::Whole(c));
    LoadPartWeights(reader, dir);
    EXPECT_LT((reader(ids, Mask()) - expected).abs().max().item<float>(), 0.05f);
    EXPECT_EQ(SafetensorsFile::Open(dir + "/model.safetensors").Entry("model.norm.weight").dtype,
              dtype == torch::kBFloat16 ? "BF16" : "F16");
  }
}

// Tensors larger than one load slice (16 MiB of file) are copied slice by slice, each slice's
// pages released; the values are those of the file, in any dtype, and a second load reads the
// released pages again.
TEST(Checkpoint, LargeTensorsLoadSliceBySliceExactly) {
  torch::manual_seed(2);
  const std::string dir = testing::TempDir("large-tensor");
  const torch::Tensor big = torch::randn({4099, 1500});  // 24.6 MB: two slices and a partial one
  const torch::Tensor scalar = torch::tensor(3.5f).reshape({});
  WriteSafetensors(dir + "/t.safetensors", {{"big", big}, {"scalar", scalar}});
  const SafetensorsFile file = SafetensorsFile::Open(dir + "/t.safetensors");
  EXPECT_TRUE(torch::equal(file.Load("big"), big));
  EXPECT_TRUE(torch::equal(file.Load("big", torch::kBFloat16), big.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(file.Load("big"), big));
  EXPECT_EQ(file.Load("scalar").item<float>(), 3.5f);
}

// Shards as transformers writes them: layers 0-1 with the embedding in one file, the rest in another.
std::string WriteSharded(ModelPart& whole, const std::string& name) {
  const std::string dir = testing::TempDir(name);
  NamedTensors first, second;
  nlohmann::json map;
  for (auto& [tensor_name, t] : whole->HfParameters()) {
    const bool early = tensor_name == "model.embed_tokens.weight" || tensor_name.rfind("model.layers.0.", 0) == 0 ||
                       tensor_name.rfind("model.layers.1.", 0) == 0;
    (early ? first : second).emplace_back(tensor_name, t);
    map[tensor_name] = early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first);
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second);
  WriteText(dir + "/model.safetensors.index.json", nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump());
  WriteText(dir + "/config.json", whole->config().ToJson().dump());
  return dir;
}

TEST(Checkpoint, ShardedCheckpointsAndPartsReadOnlyTheirShards) {
  torch::manual_seed(2);
  const ModelConfig c = TinyConfig();
  ModelPart whole(c, PartSpec::Whole(c));
  const std::string dir = WriteSharded(whole, "sharded");
  ModelPart loaded(c, PartSpec::Whole(c));
  LoadPartWeights(loaded, dir);
  const torch::Tensor ids = Ids(c);
  EXPECT_TRUE(torch::equal(loaded(ids, Mask()), whole(ids, Mask())));

  // Without the second shard the client (layers 0-1) still loads; the server cannot.
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  ModelPart client(c, PartSpec::Client(2));
  EXPECT_NO_THROW(LoadPartWeights(client, dir));
  ModelPart server(c, PartSpec::Server(c, 2));
  const Error e = Expect([&] { LoadPartWeights(server, dir); });
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(Mentions(e, "model-00002-of-00002.safetensors")) << e.what();
}

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(3);
    config_ = TinyConfig();
    ModelPart whole(config_, PartSpec::Whole(config_));
    dir_ = testing::TempDir("bad");
    SaveModel(whole, dir_);
    file_ = dir_ + "/model.safetensors";
    bytes_ = ReadBytes(file_);
  }
  Error LoadError() {
    return Expect([&] {
      ModelPart part(config_, PartSpec::Whole(config_));
      LoadPartWeights(part, dir_);
    });
  }
  // Replaces the JSON header (keeping the data section).
  void RewriteHeader(const std::function<void(nlohmann::json&)>& edit) {
    uint64_t n;
    std::memcpy(&n, bytes_.data(), 8);
    nlohmann::json header = nlohmann::json::parse(bytes_.substr(8, n));
    edit(header);
    std::string text = header.dump();
    text.append(n > text.size() ? n - text.size() : 0, ' ');
    ASSERT_EQ(text.size(), n) << "test edit must not grow the header";
    WriteBytes(file_, bytes_.substr(0, 8) + text + bytes_.substr(8 + n));
  }
  ModelConfig config_;
  std::string dir_, file_, bytes_;
};

TEST_F(BadCheckpoint, TruncatedFile) {
  WriteBytes(file_, bytes_.substr(0, bytes_.size() / 2));
  const Error e = LoadError();
  EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  EXPECT_TRUE(Mentions(e, "model.safetensors")) << e.what();
  WriteBytes(file_, bytes_.substr(0, 5));
  EXPECT_EQ(LoadError().code(), ErrorCode::kDataLoss);
}

TEST_F(BadCheckpoint, HeaderLiesAboutOffsets) {
  RewriteHeader([](nlohmann::json& h) { h["model.norm.weight"]["data_offsets"][1] = 1u << 30; });
  const Error e = LoadError();
  EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  EXPECT_TRUE(Mentions(e, "model.norm.weight")) << e.what();
}

TEST_F(BadCheckpoint, UnsupportedDtype) {
  RewriteHeader([](nlohmann::json& h) { h["model.norm.weight"]["dtype"] = "I64"; });
  const Error e = LoadError();
  EXPECT_TRUE(Mentions(e, "I64") && Mentions(e, "model.norm.weight")) << e.what();
}

TEST_F(BadCheckpoint, MissingTensor) {
  RewriteHeader([](nlohmann::json& h) { h.erase("model.layers.2.mlp.up_proj.weight"); });
  const Error e = LoadError();
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(Mentions(e, "model.layers.2.mlp.up_proj.weight")) << e.what();
}

TEST_F(BadCheckpoint, NonFiniteWeightsAreRefusedByName) {
  uint64_t n;
  std::memcpy(&n, bytes_.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes_.substr(8, n));
  const uint64_t begin = 8 + n + header["model.layers.1.self_attn.v_proj.weight"]["data_offsets"][0].get<uint64_t>();
  for (const uint32_t bits : {0xFFFFFFFFu, 0x7F800000u}) {  // a NaN, then +infinity, as its third value
    std::string damaged = bytes_;
    std::memcpy(&damaged[begin + 8], &bits, 4);
    WriteBytes(file_, damaged);
    const Error e = LoadError();
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
    EXPECT_TRUE(Mentions(e, "model.layers.1.self_attn.v_proj.weight") && Mentions(e, "not finite")) << e.what();
  }
}

TEST_F(BadCheckpoint, ShapeDisagreesWithConfig) {
  config_.intermediate_size = 40;
  const Error e = LoadError();
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(e, "gate_proj.weight") && Mentions(e, "[48, 32]")) << e.what();
}

// transformers 5 writes "dtype" and one "rope_parameters" object; 4.x "torch_dtype", "rope_theta"
// and "rope_scaling". Both forms of the same model read as the same configuration.
TEST(Checkpoint, ConfigsOfTransformers4And5ReadAlike) {
  ModelConfig c = TinyConfig();
  c.torch_dtype = "bfloat16";
  nlohmann::json v5 = c.ToJson();
  v5.erase("torch_dtype");
  v5.erase("rope_theta");
  v5["dtype"] = "bfloat16";
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = c.rope_theta;
  v5.erase("rope_scaling");
  EXPECT_EQ(ModelConfig::FromJson(v5, "v5").ToJson(), c.ToJson());

  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  const ModelConfig unscaled = ModelConfig::FromJson(v5, "v5");
  EXPECT_FALSE(unscaled.rope_scaling.has_value());
  EXPECT_EQ(unscaled.rope_theta, 1234.0);
}

TEST_F(BadCheckpoint, MissingDirectoryAndBadConfig) {
  EXPECT_EQ(Expect([] { CheckpointReader::Open("/nonexistent/model"); }).code(), ErrorCode::kNotFound);
  WriteText(dir_ + "/config.json", R"({"model_type": "gpt2", "vocab_size": 10})");
  EXPECT_TRUE(Mentions(Expect([&] { ModelConfig::Load(dir_ + "/config.json"); }), "gpt2"));
  WriteText(dir_ + "/config.json", R"({"model_type": "llama", "vocab_size": 10})");
  EXPECT_TRUE(Mentions(Expect([&] { ModelConfig::Load(dir_ + "/config.json"); }), "hidden_size"));
  WriteText(dir_ + "/config.json", R"({"model_type": "llama", "vocab_size": "many"})");
  EXPECT_TRUE(Mentions(Expect([&] { ModelConfig::Load(dir_ + "/config.json"); }), "vocab_size"));
}

TEST(Peft, AdapterExportUsesPeftNamesAndReloads) {
  torch::manual_seed(4);
  const ModelConfig c = TinyConfig();
  const std::string base = testing::TempDir("peft-base");
  ModelPart whole(c, PartSpec::Whole(c));
  SaveModel(whole, base);
  ModelPart client(c, PartSpec::Client(2)), server(c, PartSpec::Server(c, 2));
  LoadPartWeights(client, base);
  LoadPartWeights(server, base);
  LoraConfig lora;
  lora.rank = 2;
  lora.alpha = 16;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  for (ModelPart* p : {&client, &server}) {
    (*p)->AddLora(lora);
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : (*p)->LoraParameters()) t.normal_();
  }
  const std::string adapter = testing::TempDir("peft-adapter");
  SavePeftAdapter({&client, &server}, lora, base, adapter);

  const SafetensorsFile file = SafetensorsFile::Open(adapter + "/adapter_model.safetensors");
  EXPECT_TRUE(file.Has("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(file.Has("base_model.model.model.layers.3.self_attn.o_proj.lora_B.weight"));
  EXPECT_EQ(file.Names().size(), 4u * 4u * 2u);
  std::ifstream in(adapter + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 16.0);

  // A whole model with the adapter computes what the split pair computes.
  ModelPart merged(c, PartSpec::Whole(c));
  LoadPartWeights(merged, base);
  merged->AddLora(lora);
  EXPECT_EQ(LoadPeftAdapter(merged, adapter), 32);
  const torch::Tensor ids = Ids(c);
  EXPECT_TRUE(torch::allclose(merged(ids, Mask()), server(client(ids, Mask()), Mask()), 1e-5, 1e-5));

  // On a model of another shape, the refusal names the base the adapter's config gives (issue 55
  // item 6: it said "the checkpoint and config.json disagree").
  ModelConfig wider = c;
  wider.hidden_size = 64;
  wider.head_dim = 16;
  ModelPart other(wider, PartSpec::Whole(wider));
  other->AddLora(lora);
  try {
    LoadPeftAdapter(other, adapter);
    ADD_FAILURE() << "an adapter of another model loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is an adapter of another model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("names the base " + base + ": give that model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace amaq
