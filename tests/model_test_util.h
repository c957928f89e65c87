// Small models for tests: every architectural feature switched on, sizes that run in milliseconds.
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

#include "common/model/model_config.h"

namespace amaq::testing {

inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.model_type = "qwen2";  // q/k/v bias
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // grouped-query attention
  c.head_dim = 8;
  c.attention_bias = true;
  c.rope_theta = 500000.0;
  c.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 16};
  return c;
}

// A fresh directory under the test temp dir, removed by the caller or left for inspection.
inline std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/amaq-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace amaq::testing
