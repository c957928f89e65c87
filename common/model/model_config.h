// ModelConfig: the architecture of a LLaMA-family decoder, read from (and written to) a Hugging
// Face `config.json`. Supported `model_type`s: llama (LLaMA 2/3, TinyLlama), mistral, qwen2
// (docs/model.md). Unknown or inconsistent fields are errors that name the field.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace amaq {

struct RopeScaling {
  std::string type;  // "llama3" or "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool attention_bias = false;  // q/k/v projections carry a bias (qwen2 always does)
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  std::string torch_dtype = "float32";

  // Throws amaq::Error (kInvalidArgument) naming `source` and the field.
  static ModelConfig FromJson(const nlohmann::json& json, const std::string& source);
  static ModelConfig Load(const std::string& config_json_path);
  nlohmann::json ToJson() const;
  void Validate(const std::string& source) const;
};

}  // namespace amaq
