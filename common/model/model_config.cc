#include "common/model/model_config.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "common/base/error.h"

namespace amaq {
namespace {

template <typename T>
T Field(const nlohmann::json& json, const char* key, const std::string& source, T fallback,
        bool required) {
  if (!json.contains(key) || json[key].is_null()) {
    Require(!required, ErrorCode::kInvalidArgument,
            source + ": config field '" + key + "' is missing: it is required for this model");
    return fallback;
  }
  try {
    return json[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(ErrorCode::kInvalidArgument, source + ": config field '" + key +
                                                 "' has the wrong type (" + json[key].dump() + ")");
  }
}

}  // namespace

ModelConfig ModelConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  Require(json.is_object(), ErrorCode::kInvalidArgument, source + ": config is not a JSON object");
  ModelConfig c;
  c.model_type = Field<std::string>(json, "model_type", source, "llama", false);
  Require(c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2",
          ErrorCode::kInvalidArgument,
          source + ": model_type '" + c.model_type +
              "' is not supported: amaq runs llama, mistral and qwen2 (docs/model.md)");
  c.vocab_size = Field<int64_t>(json, "vocab_size", source, 0, true);
  c.hidden_size = Field<int64_t>(json, "hidden_size", source, 0, true);
  c.intermediate_size = Field<int64_t>(json, "intermediate_size", source, 0, true);
  c.num_hidden_layers = Field<int64_t>(json, "num_hidden_layers", source, 0, true);
  c.num_attention_heads = Field<int64_t>(json, "num_attention_heads", source, 0, true);
  c.num_key_value_heads =
      Field<int64_t>(json, "num_key_value_heads", source, c.num_attention_heads, false);
  c.head_dim = Field<int64_t>(json, "head_dim", source,
                              c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0,
                              false);
  c.max_position_embeddings = Field<int64_t>(json, "max_position_embeddings", source, 2048, false);
  c.rms_norm_eps = Field<double>(json, "rms_norm_eps", source, 1e-6, false);
  c.attention_bias = c.model_type == "qwen2" || Field<bool>(json, "attention_bias", source, false, false);
  c.tie_word_embeddings = Field<bool>(json, "tie_word_embeddings", source, false, false);
  c.bos_token_id = Field<int64_t>(json, "bos_token_id", source, 1, false);
  const nlohmann::json& eos = json.contains("eos_token_id") ? json["eos_token_id"] : nlohmann::json();
  c.eos_token_id = eos.is_array() && !eos.empty() ? eos[0].get<int64_t>()
                                                  : Field<int64_t>(json, "eos_token_id", source, 2, false);
  // transformers 5 writes "dtype" and the rotary settings as one "rope_parameters" object
  // (rope_theta and the scaling together); 4.x writes "torch_dtype", "rope_theta", "rope_scaling".
  c.torch_dtype = Field<std::string>(json, json.contains("dtype") ? "dtype" : "torch_dtype", source, "float32", false);
  const bool has_rope_parameters = json.contains("rope_parameters") && json["rope_parameters"].is_object();
  c.rope_theta = Field<double>(has_rope_parameters ? json["rope_parameters"] : json, "rope_theta", source, 10000.0, false);
  const char* scaling_key = has_rope_parameters ? "rope_parameters" : "rope_scaling";
  if (json.contains(scaling_key) && !json[scaling_key].is_null()) {
    const nlohmann::json& rs = json[scaling_key];
    RopeScaling s;
    s.type = rs.contains("rope_type") ? Field<std::string>(rs, "rope_type", source, "", true)
                                      : Field<std::string>(rs, "type", source, "", true);
    if (s.type != "default") {
      s.factor = Field<double>(rs, "factor", source, 1.0, true);
      s.low_freq_factor = Field<double>(rs, "low_freq_factor", source, 1.0, false);
      s.high_freq_factor = Field<double>(rs, "high_freq_factor", source, 4.0, false);
      s.original_max_position_embeddings =
          Field<int64_t>(rs, "original_max_position_embeddings", source, 8192, false);
      c.rope_scaling = s;
    }
  }
  c.Validate(source);
  return c;
}

ModelConfig ModelConfig::Load(const std::string& path) {
  std::ifstream in(path);
  Require(in.good(), ErrorCode::kNotFound,
          path + ": cannot open the model config: check the model directory");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, path + ": config is not valid JSON (" + e.what() + ")");
  }
  return FromJson(json, path);
}

void ModelConfig::Validate(const std::string& source) const {
  const auto positive = [&](int64_t v, const char* name) {
    Require(v > 0, ErrorCode::kInvalidArgument,
            source + ": config field '" + name + "' must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  Require(num_attention_heads % num_key_value_heads == 0, ErrorCode::kInvalidArgument,
          source + ": num_attention_heads (" + std::to_string(num_attention_heads) +
              ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  Require(head_dim % 2 == 0, ErrorCode::kInvalidArgument,
          source + ": head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  Require(rms_norm_eps > 0 && rope_theta > 0, ErrorCode::kInvalidArgument,
          source + ": rms_norm_eps and rope_theta must be positive");
  if (rope_scaling) {
    Require(rope_scaling->type == "llama3" || rope_scaling->type == "linear",
            ErrorCode::kInvalidArgument,
            source + ": rope_scaling type '" + rope_scaling->type +
                "' is not supported: amaq implements llama3 and linear");
    Require(rope_scaling->factor > 0, ErrorCode::kInvalidArgument,
            source + ": rope_scaling.factor must be positive");
  }
}

nlohmann::json ModelConfig::ToJson() const {
  nlohmann::json j = {
      {"architectures", {model_type == "qwen2" ? "Qwen2ForCausalLM"
                         : model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"attention_bias", attention_bias},
      {"tie_word_embeddings", tie_word_embeddings},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
      {"hidden_act", "silu"},
      {"torch_dtype", torch_dtype},
  };
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", rope_scaling->type},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings",
                          rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

}  // namespace amaq
