#include "common/lora_keys.h"

#include <sstream>

#include "common/error.h"

namespace amaq {

void AddLoraKeys(Config& config) {
  config.AddInt("lora_rank", 16, "LoRA rank r", 1, 4096);
  config.AddDouble("lora_alpha", 32, "LoRA alpha (scaling alpha / r)", 1e-6, 1e6);
  config.AddDouble("lora_dropout", 0.0, "LoRA dropout", 0, 0.99);
  config.AddString("lora_targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                   "comma-separated PEFT target_modules");
}

LoraConfig LoraFromConfig(const Config& config) {
  LoraConfig lora;
  lora.rank = config.Int("lora_rank");
  lora.alpha = config.Double("lora_alpha");
  lora.dropout = config.Double("lora_dropout");
  lora.target_modules.clear();
  std::stringstream targets(config.String("lora_targets"));
  for (std::string t; std::getline(targets, t, ',');) {
    if (!t.empty()) lora.target_modules.push_back(t);
  }
  try {
    lora.Validate();
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("config: ") + e.what());
  }
  return lora;
}

}  // namespace amaq
