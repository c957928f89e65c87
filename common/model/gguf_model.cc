#include "common/model/gguf_model.h"

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include <filesystem>

#include "common/base/atomic_file.h"
#include "common/base/error.h"
#include "common/model/safetensors.h"

namespace amaq {
namespace {

// llama.cpp's tensor names (gguf-py's MODEL_TENSOR names for LLaMA) and transformers' for the same
// tensor; "{}" is the layer.
struct TensorName {
  const char* gguf;
  const char* hf;
};
const TensorName kLayerTensors[] = {
    {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
    {"blk.{}.attn_q.weight", "model.layers.{}.self_attn.q_proj.weight"},
    {"blk.{}.attn_k.weight", "model.layers.{}.self_attn.k_proj.weight"},
    {"blk.{}.attn_v.weight", "model.layers.{}.self_attn.v_proj.weight"},
    {"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight"},
    {"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
    {"blk.{}.ffn_gate.weight", "model.layers.{}.mlp.gate_proj.weight"},
    {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight"},
    {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"},
};

std::string ForLayer(const char* pattern, int64_t layer) {
  std::string name = pattern;
  name.replace(name.find("{}"), 2, std::to_string(layer));
  return name;
}

// The tensor `name` as transformers holds it: GGUF lists dims fastest first, so the shape reverses.
torch::Tensor Load(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo& info = file.Tensor(name);
  torch::Tensor out = torch::empty(std::vector<int64_t>(info.dims.rbegin(), info.dims.rend()), torch::kFloat);
  file.DequantizeInto(info, out.data_ptr<float>());
  return out;
}

// The pre-tokenizer that llama.cpp's `tokenizer.ggml.pre` name stands for (llama-vocab.cpp), as
// tokenizer.json pre-tokenizers; every one ends in GPT-2's byte-level split.
nlohmann::json PreTokenizer(const std::string& pre, const std::string& source) {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                     {"use_regex", true}};
  if (pre == "gpt2" || pre == "default") return byte_level;
  if (pre == "smollm") {
    // Each digit its own piece, then GPT-2's split (SmolLM's own tokenizer.json: Digits, ByteLevel).
    const nlohmann::json digits = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}"}}},
                                   {"behavior", "Isolated"}, {"invert", false}};
    return {{"type", "Sequence"}, {"pretokenizers", {digits, byte_level}}};
  }
  throw Error(ErrorCode::kInvalidArgument,
              source + ": tokenizer.ggml.pre is '" + pre +
                  "', which amaq does not convert (gpt2, default, smollm): use the model's own tokenizer.json");
}

// ggml's token types (llama.h's llama_token_type): CONTROL tokens are special, USER_DEFINED added.
constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;

// tokenizer.json and tokenizer_config.json from `tokenizer.ggml.*` (a "gpt2" byte-level BPE).
void WriteTokenizer(const GgufFile& file, const ModelConfig& config, const std::filesystem::path& dir) {
  const std::string& source = file.source();
  const std::string model = file.Text("tokenizer.ggml.model");
  Require(model == "gpt2", ErrorCode::kInvalidArgument,
          source + ": tokenizer.ggml.model is '" + model + "'; amaq converts byte-level BPE ('gpt2') tokenizers only");
  const std::vector<std::string> tokens = file.Texts("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = file.Integers("tokenizer.ggml.token_type");
  Require(types.size() == tokens.size(), ErrorCode::kDataLoss,
          source + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
              std::to_string(tokens.size()) + " tokens: the file is damaged");
  Require(static_cast<int64_t>(tokens.size()) == config.vocab_size, ErrorCode::kDataLoss,
          source + ": " + std::to_string(tokens.size()) + " tokens for an embedding of " +
              std::to_string(config.vocab_size) + " rows: the file is damaged");
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab[tokens[id]] = id;
    if (types[id] == kTokenControl || types[id] == kTokenUserDefined) {
      added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", types[id] == kTokenUserDefined},
                       {"special", types[id] == kTokenControl}});
    }
  }
  const nlohmann::json tokenizer = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", PreTokenizer(file.Has("tokenizer.ggml.pre") ? file.Text("tokenizer.ggml.pre") : "default", source)},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                 {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab},
                 {"merges", file.Texts("tokenizer.ggml.merges")}}}};
  WriteFileAtomically((dir / "tokenizer.json").string(), tokenizer.dump() + "\n");

  const auto token = [&](const std::string& key) -> nlohmann::json {
    if (!file.Has(key)) return nullptr;
    const int64_t id = file.Integer(key);
    Require(id >= 0 && id < static_cast<int64_t>(tokens.size()), ErrorCode::kDataLoss,
            source + ": " + key + " is " + std::to_string(id) + ", not a token id: the file is damaged");
    return tokens[static_cast<size_t>(id)];
  };
  nlohmann::json tokenizer_config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", config.max_position_embeddings},
      {"bos_token", token("tokenizer.ggml.bos_token_id")}, {"eos_token", token("tokenizer.ggml.eos_token_id")},
      {"unk_token", token("tokenizer.ggml.unknown_token_id")}, {"pad_token", token("tokenizer.ggml.padding_token_id")},
      {"add_bos_token", file.Has("tokenizer.ggml.add_bos_token") && file.metadata().at("tokenizer.ggml.add_bos_token").boolean},
      {"clean_up_tokenization_spaces", false}};
  if (file.Has("tokenizer.chat_template")) tokenizer_config["chat_template"] = file.Text("tokenizer.chat_template");
  WriteFileAtomically((dir / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n");
}

}  // namespace

ModelConfig GgufModelConfig(const GgufFile& file) {
  const std::string arch = file.Text("general.architecture");
  Require(arch == "llama", ErrorCode::kInvalidArgument,
          file.source() + ": general.architecture is '" + arch + "'; amaq reads LLaMA-architecture GGUF files only");
  ModelConfig c;
  c.model_type = "llama";
  c.num_hidden_layers = file.Integer("llama.block_count");
  c.hidden_size = file.Integer("llama.embedding_length");
  c.intermediate_size = file.Integer("llama.feed_forward_length");
  c.num_attention_heads = file.Integer("llama.attention.head_count");
  c.num_key_value_heads = file.Has("llama.attention.head_count_kv") ? file.Integer("llama.attention.head_count_kv")
                                                                    : c.num_attention_heads;
  c.max_position_embeddings = file.Integer("llama.context_length");
  c.rms_norm_eps = file.Real("llama.attention.layer_norm_rms_epsilon");
  if (file.Has("llama.rope.freq_base")) c.rope_theta = file.Real("llama.rope.freq_base");
  Require(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, ErrorCode::kDataLoss,
          file.source() + ": llama.embedding_length " + std::to_string(c.hidden_size) +
              " is not a multiple of llama.attention.head_count " + std::to_string(c.num_attention_heads));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  if (file.Has("llama.rope.dimension_count")) {
    Require(file.Integer("llama.rope.dimension_count") == c.head_dim, ErrorCode::kInvalidArgument,
            file.source() + ": llama.rope.dimension_count is not the head size: partial rotary embeddings are not supported");
  }
  Require(!file.Has("llama.rope.scaling.type") || file.Text("llama.rope.scaling.type") == "none",
          ErrorCode::kInvalidArgument, file.source() + ": rope scaling in a GGUF file is not supported");
  c.vocab_size = file.Tensor("token_embd.weight").dims.at(1);
  if (file.Has("llama.vocab_size")) {
    Require(file.Integer("llama.vocab_size") == c.vocab_size, ErrorCode::kDataLoss,
            file.source() + ": llama.vocab_size disagrees with token_embd.weight's rows: the file is damaged");
  }
  c.tie_word_embeddings = true;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.name == "output.weight") c.tie_word_embeddings = false;
  }
  if (file.Has("tokenizer.ggml.bos_token_id")) c.bos_token_id = file.Integer("tokenizer.ggml.bos_token_id");
  if (file.Has("tokenizer.ggml.eos_token_id")) c.eos_token_id = file.Integer("tokenizer.ggml.eos_token_id");
  c.Validate(file.source());
  return c;
}

torch::Tensor UnpermuteRotaryRows(const torch::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0);
  Require(rows % (2 * heads) == 0, ErrorCode::kDataLoss,
          "a q/k projection of " + std::to_string(rows) + " rows is not " + std::to_string(heads) +
              " heads of an even size: the file is damaged");
  // llama.cpp: rows (head, half, i) -> (head, i, half); transformers' order is (head, half, i).
  return weight.reshape({heads, rows / heads / 2, 2, weight.size(1)}).transpose(1, 2).reshape(weight.sizes()).contiguous();
}

NamedTensors GgufModelTensors(const GgufFile& file, const ModelConfig& config) {
  NamedTensors out;
  const auto add = [&](const std::string& hf, torch::Tensor value) {
    out.emplace_back(hf, std::move(value));
  };
  add("model.embed_tokens.weight", Load(file, "token_embd.weight"));
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (const TensorName& n : kLayerTensors) {
      const std::string hf = ForLayer(n.hf, layer);
      torch::Tensor w = Load(file, ForLayer(n.gguf, layer));
      if (hf.find("q_proj") != std::string::npos) w = UnpermuteRotaryRows(w, config.num_attention_heads);
      if (hf.find("k_proj") != std::string::npos) w = UnpermuteRotaryRows(w, config.num_key_value_heads);
      add(hf, std::move(w));
    }
  }
  add("model.norm.weight", Load(file, "output_norm.weight"));
  if (!config.tie_word_embeddings) add("lm_head.weight", Load(file, "output.weight"));
  return out;
}

void ConvertGgufToHf(const std::string& gguf_path, const std::string& dir) {
  const GgufFile file = GgufFile::Open(gguf_path);
  const ModelConfig config = GgufModelConfig(file);
  std::filesystem::create_directories(dir);
  if (file.Has("tokenizer.ggml.model")) {
    WriteTokenizer(file, config, dir);
  } else {
    spdlog::warn("{} has no tokenizer (tokenizer.ggml.*): {} gets none; copy the model's tokenizer.json there", gguf_path, dir);
  }
  WriteSafetensors((std::filesystem::path(dir) / "model.safetensors").string(), GgufModelTensors(file, config),
                   torch::kFloat, {{"format", "pt"}, {"converted_from", std::filesystem::path(gguf_path).filename().string()}});
  // config.json last: a directory with it is complete (an interrupted conversion is not a model).
  WriteFileAtomically((std::filesystem::path(dir) / "config.json").string(), config.ToJson().dump(2) + "\n");
}

}  // namespace amaq
