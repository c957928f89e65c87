// A LLaMA GGUF file as a Hugging Face directory (common/model/gguf_model.h): the config from the
// llama.* keys, q/k rows back in transformers' order (checked against llama.cpp's permutation
// written per row), tied embeddings, the tokenizer from tokenizer.ggml.*, and the errors for files
// that are not LLaMA models. scripts/gguf-interop checks the same path against transformers.
#include "common/model/gguf_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "common/text/tokenizer.h"
#include "gguf_writer.h"
#include "model_test_util.h"

namespace amaq {
namespace {

using testing_gguf::GgufBuilder;

// llama.cpp's permutation (convert_hf_to_gguf's LlamaModel.permute), row by row: within a head of
// d rows, the stored row 2i + half is transformers' row half * d/2 + i.
torch::Tensor LlamaCppPermute(const torch::Tensor& w, int64_t heads) {
  const int64_t d = w.size(0) / heads;
  torch::Tensor stored = torch::empty_like(w);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      for (int64_t half = 0; half < 2; ++half) stored[h * d + 2 * i + half] = w[h * d + half * (d / 2) + i];
    }
  }
  return stored;
}

TEST(GgufModel, UnpermuteUndoesLlamaCppsRotaryOrder) {
  for (const int64_t heads : {1, 3}) {
    const torch::Tensor w = torch::arange(heads * 8 * 5, torch::kFloat).reshape({heads * 8, 5});
    const torch::Tensor stored = LlamaCppPermute(w, heads);
    EXPECT_FALSE(torch::equal(stored, w));
    EXPECT_TRUE(torch::equal(UnpermuteRotaryRows(stored, heads), w)) << heads << " heads";
  }
}

std::vector<float> Values(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + 0.001f * static_cast<float>(i);
  return v;
}

// A one-layer LLaMA (hidden 8, 2 heads of 4, 1 key/value head, feed-forward 16) with a four-token
// byte-level BPE tokenizer ("a", "b", "ab", and the control token "<|s|>"); F32 tensors whose
// values say where they came from.
GgufBuilder TinyLlama(const std::string& tokenizer_model = "gpt2", const std::string& pre = "smollm") {
  GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.U32("llama.block_count", 1);
  b.U32("llama.context_length", 128);
  b.U32("llama.embedding_length", 8);
  b.U32("llama.feed_forward_length", 16);
  b.U32("llama.attention.head_count", 2);
  b.U32("llama.attention.head_count_kv", 1);
  b.F32("llama.rope.freq_base", 50000.0f);
  b.F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.U32("llama.rope.dimension_count", 4);
  b.Str("tokenizer.ggml.model", tokenizer_model);
  b.Str("tokenizer.ggml.pre", pre);
  b.Strs("tokenizer.ggml.tokens", {"a", "b", "ab", "<|s|>"});
  b.I32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  b.Strs("tokenizer.ggml.merges", {"a b"});
  b.U32("tokenizer.ggml.bos_token_id", 3);
  b.U32("tokenizer.ggml.eos_token_id", 3);
  b.Bool("tokenizer.ggml.add_bos_token", false);
  b.Str("tokenizer.chat_template", "{{ messages }}");
  b.Tensor("token_embd.weight", {8, 4}, Values(32, 0.1f));
  b.Tensor("blk.0.attn_norm.weight", {8}, Values(8, 1.0f));
  b.Tensor("blk.0.attn_q.weight", {8, 8}, Values(64, -0.2f));
  b.Tensor("blk.0.attn_k.weight", {8, 4}, Values(32, -0.1f));
  b.Tensor("blk.0.attn_v.weight", {8, 4}, Values(32, 0.2f));
  b.Tensor("blk.0.attn_output.weight", {8, 8}, Values(64, 0.3f));
  b.Tensor("blk.0.ffn_norm.weight", {8}, Values(8, 0.9f));
  b.Tensor("blk.0.ffn_gate.weight", {8, 16}, Values(128, -0.3f));
  b.Tensor("blk.0.ffn_up.weight", {8, 16}, Values(128, 0.05f));
  b.Tensor("blk.0.ffn_down.weight", {16, 8}, Values(128, -0.05f));
  b.Tensor("output_norm.weight", {8}, Values(8, 1.1f));
  return b;
}

std::string WriteFile(const std::string& dir, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/model.gguf";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(GgufModel, ConvertsATinyLlamaIntoADirectoryAmaqLoads) {
  const std::string dir = testing::TempDir("gguf-tiny");
  const std::string gguf = WriteFile(dir, TinyLlama().Bytes());
  ConvertGgufToHf(gguf, dir + "/hf");

  const ModelConfig c = ModelConfig::Load(dir + "/hf/config.json");
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.hidden_size, 8);
  EXPECT_EQ(c.intermediate_size, 16);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 4);
  EXPECT_EQ(c.max_position_embeddings, 128);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.bos_token_id, 3);

  ModelPart model(c, PartSpec::Whole(c));
  LoadPartWeights(model, dir + "/hf");
  std::map<std::string, torch::Tensor> weights;
  for (auto& [name, tensor] : model->HfParameters()) weights[name] = tensor;
  const auto stored = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
    return torch::tensor(v).reshape({rows, cols});
  };
  EXPECT_TRUE(torch::equal(weights.at("model.layers.0.self_attn.q_proj.weight"),
                           UnpermuteRotaryRows(stored(Values(64, -0.2f), 8, 8), 2)));
  EXPECT_TRUE(torch::equal(LlamaCppPermute(weights.at("model.layers.0.self_attn.k_proj.weight"), 1),
                           stored(Values(32, -0.1f), 4, 8)));
  EXPECT_TRUE(torch::equal(weights.at("model.layers.0.self_attn.v_proj.weight"), stored(Values(32, 0.2f), 4, 8)));
  EXPECT_TRUE(torch::equal(weights.at("model.layers.0.mlp.down_proj.weight"), stored(Values(128, -0.05f), 8, 16)));
  EXPECT_TRUE(torch::equal(weights.at("lm_head.weight"), weights.at("model.embed_tokens.weight")));

  const auto tokenizer = Tokenizer::Load(dir + "/hf");
  EXPECT_EQ(tokenizer->Encode("ab<|s|>ba"), (std::vector<int64_t>{2, 3, 1, 0}));
  std::ifstream config_file(dir + "/hf/tokenizer_config.json");
  const std::string tokenizer_config((std::istreambuf_iterator<char>(config_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(tokenizer_config.find("\"chat_template\": \"{{ messages }}\""), std::string::npos) << tokenizer_config;
  EXPECT_NE(tokenizer_config.find("\"eos_token\": \"<|s|>\""), std::string::npos) << tokenizer_config;
}

// The error converting `b`; a failed conversion leaves no config.json (no directory that looks
// like a model).
ErrorCode ConvertError(const GgufBuilder& b, std::string* message) {
  const std::string dir = testing::TempDir("gguf-bad");
  ErrorCode code = ErrorCode::kInternal;
  try {
    ConvertGgufToHf(WriteFile(dir, b.Bytes()), dir + "/hf");
  } catch (const Error& e) {
    *message = e.what();
    code = e.code();
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf/config.json"));
  return code;
}

TEST(GgufModel, ModelsAndTokenizersItCannotConvertAreRefusedByName) {
  std::string message;
  GgufBuilder other;
  other.Str("general.architecture", "gpt2");
  EXPECT_EQ(ConvertError(other, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("general.architecture is 'gpt2'"), std::string::npos) << message;

  GgufBuilder missing;
  missing.Str("general.architecture", "llama");
  EXPECT_EQ(ConvertError(missing, &message), ErrorCode::kDataLoss);
  EXPECT_NE(message.find("metadata 'llama.block_count' is missing"), std::string::npos) << message;

  EXPECT_EQ(ConvertError(TinyLlama("llama"), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("tokenizer.ggml.model is 'llama'"), std::string::npos) << message;
  EXPECT_EQ(ConvertError(TinyLlama("gpt2", "qwen2"), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("tokenizer.ggml.pre is 'qwen2'"), std::string::npos) << message;
}

}  // namespace
}  // namespace amaq
